"""The keyword vocabulary's run cancelled at each point (a serve shutting down, a cycle's deadline): the lock
is always let go, never while the run still writes, and never on the event loop."""

from __future__ import annotations

import asyncio
import fcntl
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from pipeline.ingest import vocabulary_run
from pipeline.ingest.vocabulary_run import VocabularyRun
from pipeline.models.sparse import Bm25Encoder
from pipeline.models.vocabulary import TermCounts
from tests.test_keyword_expansion import TrigramEmbedder
from tests.test_vocabulary_kept import _held_at_page_2, _two_pages_counted


def _lock_file(path: Path) -> Path:
    return path.with_name(path.stem + ".lock")


def _lock_is_free(path: Path) -> bool:
    fd = os.open(_lock_file(path), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


async def _until(check: Any, seconds: float = 10.0) -> bool:
    for _ in range(int(seconds / 0.02)):
        if check():
            return True
        await asyncio.sleep(0.02)
    return bool(check())


async def _cancelled_while_counting(path: Path, monkeypatch: pytest.MonkeyPatch, *,
                                    holding: bool = False) -> tuple[asyncio.Task[None], threading.Event]:
    """A run counting two pages, cancelled while page "2" is counted (held until ``release`` is set): its
    ``finish`` waits for that thread."""
    started, release = _held_at_page_2(monkeypatch, holding=holding)
    task = asyncio.create_task(_two_pages_counted(path, []))
    await asyncio.to_thread(started.wait, 10)
    task.cancel()
    await asyncio.sleep(0.05)
    return task, release


async def test_a_run_cancelled_while_it_waits_for_counting_never_blocks_the_event_loop(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Cancelled again while it waited for a counting thread, the run retired its counts on the event loop:
    the loop stood still until that thread let go of the counts (a spill of rows at 50,000 pages)."""
    path = tmp_path / "vocab.npz"
    task, release = await _cancelled_while_counting(path, monkeypatch, holding=True)
    threading.Timer(0.6, release.set).start()
    task.cancel()
    t = asyncio.get_running_loop().time()
    await asyncio.sleep(0.05)
    assert asyncio.get_running_loop().time() - t < 0.4
    with pytest.raises(asyncio.CancelledError):
        await task
    assert release.is_set()
    async with VocabularyRun.held(path, Bm25Encoder(), None, TrigramEmbedder(), []) as run:
        assert run is not None  # the lock was let go


async def test_a_run_cancelled_while_it_writes_keeps_the_lock_until_the_writing_ends(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Cancelled while the vocabulary was written (a serve shutting down), the run let the lock go while its
    thread went on writing the counts: a waiting run could read them half-written or be overwritten."""
    path = tmp_path / "vocab.npz"
    writing, go_on = threading.Event(), threading.Event()
    real = vocabulary_run.update_vocabulary

    def slow(*args: Any) -> Any:
        writing.set()
        go_on.wait(10)
        return real(*args)

    monkeypatch.setattr(vocabulary_run, "update_vocabulary", slow)
    task = asyncio.create_task(_two_pages_counted(path, []))
    await asyncio.to_thread(writing.wait, 10)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not _lock_is_free(path)  # the writing goes on, under the lock
    go_on.set()
    assert await _until(lambda: _lock_is_free(path))
    df = TermCounts.load(path).df
    assert df["alpha"] == 1 and df["gamma"] == 1


async def test_a_run_cancelled_twice_before_its_thread_started_still_lets_the_lock_go(
        tmp_path: Path) -> None:
    """Its end was a work item still queued for a thread; a second cancel dropped it, and the lock with it:
    the next run in the process waited forever."""
    path = tmp_path / "vocab.npz"
    run = await VocabularyRun.start(path, Bm25Encoder(), None)
    assert run is not None
    free, pool = threading.Event(), ThreadPoolExecutor(1)
    asyncio.get_running_loop().set_default_executor(pool)  # one thread, kept busy: the run's work waits
    try:
        pool.submit(free.wait, 10)
        task = asyncio.create_task(run.finish(TrigramEmbedder(), []))
        await asyncio.sleep(0.05)
        task.cancel()
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert not _lock_is_free(path)
    finally:
        free.set()
    assert await _until(lambda: _lock_is_free(path))


async def test_a_start_cancelled_while_it_waits_for_the_lock_lets_it_go_when_taken(tmp_path: Path) -> None:
    """Cancelled while another process held the lock, the start's thread took it later for a run that
    nobody would finish: every later run in the process waited forever."""
    path = tmp_path / "vocab.npz"
    other = os.open(_lock_file(path), os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(other, fcntl.LOCK_EX)
    try:
        task = asyncio.create_task(VocabularyRun.start(path, Bm25Encoder(), None))
        await asyncio.sleep(0.2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    finally:
        os.close(other)  # the other process ends: the cancelled start's thread takes the lock
    assert await _until(lambda: _lock_is_free(path))


async def test_a_run_cancelled_while_it_waits_for_counting_leaves_no_stale_counts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The earlier run's counts stayed on disk: the next run took them for current and never counted the words
    of the pages the cancelled run had written."""
    path = tmp_path / "vocab.npz"
    async with VocabularyRun.held(path, Bm25Encoder(), None, TrigramEmbedder(), []) as run:
        assert run is not None
        await run.count([("0", ["omega"])])
    assert TermCounts.path_for(path).exists()
    task, release = await _cancelled_while_counting(path, monkeypatch)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    release.set()
    assert await _until(lambda: _lock_is_free(path))
    assert not TermCounts.path_for(path).exists()  # the next run counts afresh
