"""The event-loop watch names where serve's loop was blocked (pipeline/runtime/loop_watch.py)."""

from __future__ import annotations

import asyncio
import logging
import time
from types import SimpleNamespace

import pytest

from evident.settings import Settings
from pipeline.runtime.loop_watch import LoopWatch, freeze_start_up, where


def _a_blocking_call(seconds: float) -> None:
    time.sleep(seconds)


async def test_a_blocked_loop_is_one_warning_naming_the_blocking_call(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="evident.loop"):
        async with LoopWatch(0.1).watching() as watch:
            await asyncio.sleep(0.2)
            _a_blocking_call(0.6)
            await asyncio.sleep(0.2)
    blocked = [r.getMessage() for r in caplog.records if "_a_blocking_call" in r.getMessage()]
    assert len(blocked) == 1, caplog.text
    ms = int(blocked[0].split("blocked ")[1].split(" ms")[0])
    assert 500 <= ms < 5000
    assert "test_loop_watch.py:" in blocked[0]
    assert watch.stalls >= 1 and watch.longest_s >= 0.5


async def test_a_loop_that_only_awaits_is_never_reported(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="evident.loop"):
        async with LoopWatch(0.5).watching() as watch:
            for _ in range(10):
                await asyncio.sleep(0.05)
    assert watch.stalls == 0 and not caplog.records


def test_where_names_the_innermost_frames_first_without_locals() -> None:
    secret = "xoxb-not-to-be-logged"  # noqa: F841 - a local the summary must not show
    import sys

    text = where(sys._getframe())
    assert text.startswith("tests/test_loop_watch.py:") and "in test_where_names" in text
    assert "xoxb" not in text and where(None) == ""


def test_serve_watches_its_loop_at_100_ms_unless_turned_off() -> None:
    assert Settings.load(env={}).serve.loop_watch_ms == 100
    assert Settings.load(env={"EVIDENT_LOOP_WATCH_MS": "0"}).serve.loop_watch_ms == 0
    assert Settings.load(env={}).serve.switch_interval_ms == 1.0
    assert Settings.load(env={"EVIDENT_SWITCH_INTERVAL_MS": "0.5"}).serve.switch_interval_ms == 0.5


async def test_a_garbage_collection_during_a_block_is_named(caplog: pytest.LogCaptureFixture) -> None:
    """A collection keeps the GIL, so the watch cannot take a stack then; it names the collection instead."""
    import gc

    many: list[list[int]] = [[] for _ in range(1_000_000)]  # noqa: F841 - tracked: a full collection walks all
    with caplog.at_level(logging.WARNING, logger="evident.loop"):
        async with LoopWatch(0.04).watching():
            await asyncio.sleep(0.1)
            for _ in range(5):  # a block that is mostly full collections
                gc.collect()
            await asyncio.sleep(0.1)
    blocked = [r.getMessage() for r in caplog.records if "blocked" in r.getMessage()]
    assert any("during garbage collection: generation 2, " in m for m in blocked), caplog.text
    assert not any(isinstance(getattr(cb, "__self__", None), LoopWatch) for cb in gc.callbacks)  # removed


async def test_short_collections_in_a_block_are_not_blamed(caplog: pytest.LogCaptureFixture) -> None:
    """A block that allocates runs many quick young-generation collections: they did not cause it."""
    with caplog.at_level(logging.WARNING, logger="evident.loop"):
        async with LoopWatch(0.1).watching():
            await asyncio.sleep(0.1)
            _a_blocking_call(0.05)  # the heartbeat is overdue before the churn starts
            churn = [{"n": i} for i in range(20_000)]
            _a_blocking_call(0.3)
            await asyncio.sleep(0.1)
    blocked = [r.getMessage() for r in caplog.records if "blocked" in r.getMessage()]
    assert blocked and len(churn) == 20_000
    assert not any("garbage collection" in m for m in blocked), caplog.text


class _StartUpObject:
    """Something start-up made and keeps: it refers to itself, so only the cycle collector could free it."""

    def __init__(self) -> None:
        self.itself = self


def _scanned(obj: object) -> bool:
    import gc

    return any(o is obj for o in gc.get_objects())  # generations 0-2: what a collection walks


def test_start_up_objects_leave_the_collectors_scans() -> None:
    import gc

    kept = _StartUpObject()
    assert _scanned(kept)
    try:
        frozen = freeze_start_up()
        # this test process's modules at least; counted by the object, since a frozen object another thread
        # releases leaves the frozen set and lowers the count (CI saw 542,176 frozen, then 542,174)
        assert frozen > 1000 and not _scanned(kept)
        gc.collect()
        assert not _scanned(kept) and kept.itself is kept  # a full collection leaves it where it is
    finally:
        gc.unfreeze()
    assert _scanned(kept)


async def test_an_unexpected_failure_of_one_sync_cycle_does_not_end_the_sync_loop(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import connectors.confluence.run as confluence_run
    from evident.serve import SyncLoop

    cycles: list[int] = []

    async def broken(*args: object, **kwargs: object) -> None:
        cycles.append(1)
        raise RuntimeError("a bug in this cycle")

    monkeypatch.setattr(confluence_run, "run_sync", broken)
    from pipeline.models.sparse import Bm25Encoder

    engine = SimpleNamespace(sparse=Bm25Encoder())  # the sync itself is replaced: only its sparse encoder
    loop = SyncLoop(Settings.load(env={}), engine=engine)  # type: ignore[arg-type]
    with caplog.at_level(logging.ERROR, logger="evident.serve"):
        task = asyncio.create_task(loop.run())
        for _ in range(100):
            await asyncio.sleep(0.02)
            if cycles and any("unexpectedly" in r.getMessage() for r in caplog.records):
                break
        assert cycles == [1] and not task.done()  # logged, and waiting for its next cycle
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert loop.last_ok is None
