"""Segment builds in serve's index worker wait for a quiet moment (pipeline/index/quiet_builds.py)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from evident.settings import Settings
from pipeline.access.scope import EVERYTHING
from pipeline.errors import IndexError_
from pipeline.factory import make_index_from
from pipeline.index.edge_worker import ProcessEdgeIndex
from pipeline.index.quiet_builds import QuietBuilds
from pipeline.types import SearchRequest
from tests.index_contract import DIM, EMBEDDER, QUERY_DENSE_T, QUERY_SPARSE, page_version


def _question() -> SearchRequest:
    return SearchRequest(dense=QUERY_DENSE_T, sparse=QUERY_SPARSE, scope=EVERYTHING)


@contextlib.asynccontextmanager
async def _opened(tmp_path: Path, quiet_s: float, max_pending: int) -> AsyncIterator[ProcessEdgeIndex]:
    idx = ProcessEdgeIndex(tmp_path / "index", build_quiet_s=quiet_s, build_max_pending=max_pending)
    await idx.open(dense_dim=DIM, embedder=EMBEDDER)
    try:
        yield idx
    finally:
        await idx.close()  # idempotent


async def test_a_sync_s_build_waits_until_no_request_has_come_for_the_quiet_period(tmp_path: Path) -> None:
    async with _opened(tmp_path, quiet_s=1.5, max_pending=1000) as idx:
        await asyncio.wait_for(idx.builds.settled(), 10)  # what opening scheduled (nothing to build)
        idx.builds.builds = 0
        await idx.replace_page("P", "hash-p", page_version("P", "p", 3))
        assert await idx.search(_question()) != []  # a question just answered: not quiet
        assert await idx.optimize() is False  # scheduled, not run: the sync's call returns at once
        assert idx.builds.scheduled and idx.builds.builds == 0 and idx.builds.pending == 3
        for _ in range(6):  # questions keep coming: each one restarts the quiet period
            assert await idx.search(_question()) != []
            await asyncio.sleep(0.2)
        assert idx.builds.builds == 0
        await asyncio.wait_for(idx.builds.settled(), 10)
        assert idx.builds.builds == 1 and not idx.builds.scheduled and idx.builds.pending == 0
        assert await idx.count() == 3


async def test_a_question_waiting_for_the_worker_postpones_the_build_until_answered(tmp_path: Path) -> None:
    async with _opened(tmp_path, quiet_s=0.5, max_pending=1000) as idx:
        await asyncio.wait_for(idx.builds.settled(), 10)  # what opening scheduled (nothing to build)
        idx.builds.builds = 0
        await idx.replace_page("P", "hash-p", page_version("P", "p", 3))
        assert await idx.search(_question()) != []  # answered just now: the build waits
        assert await idx.optimize() is False
        pid = idx.pid
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)  # the worker busy (a segment build): the question waits past quiet_s
        try:
            asking = asyncio.create_task(idx.search(_question()))
            await asyncio.sleep(1.2)
            assert idx.builds.builds == 0
        finally:
            os.kill(pid, signal.SIGCONT)
        assert await asking != []
        assert idx.builds.builds == 0  # the quiet period counts from the answer
        await asyncio.wait_for(idx.builds.settled(), 10)
        assert idx.builds.builds == 1 and idx.builds.answering == 0
        os.kill(pid, signal.SIGSTOP)  # a question given up while it waits is no longer in flight
        try:
            asking = asyncio.create_task(idx.search(_question()))
            await asyncio.sleep(0.1)
            assert idx.builds.answering == 1
            asking.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asking
        finally:
            os.kill(pid, signal.SIGCONT)
        assert idx.builds.answering == 0


async def test_readiness_checks_do_not_postpone_a_build(tmp_path: Path) -> None:
    async with _opened(tmp_path, quiet_s=0.5, max_pending=1000) as idx:
        await idx.replace_page("P", "hash-p", page_version("P", "p", 3))
        await idx.optimize()

        async def probes() -> None:
            while True:  # a readiness probe every 0.1 s, as an orchestrator might
                await idx.ready()
                await asyncio.sleep(0.1)

        prober = asyncio.create_task(probes())
        try:
            await asyncio.wait_for(idx.builds.settled(), 10)
        finally:
            prober.cancel()
        assert idx.builds.builds == 1


async def test_enough_waiting_points_build_at_once(tmp_path: Path) -> None:
    async with _opened(tmp_path, quiet_s=60, max_pending=5) as idx:
        await idx.replace_page("P", "hash-p", page_version("P", "p", 3))
        assert await idx.optimize() is False
        assert idx.builds.scheduled
        await idx.replace_page("Q", "hash-q", page_version("Q", "q", 3))  # 6 waiting >= 5
        await idx.optimize()
        assert idx.builds.builds == 1 and not idx.builds.scheduled and idx.builds.pending == 0


async def test_no_quiet_period_builds_at_the_end_of_each_sync(tmp_path: Path) -> None:
    async with _opened(tmp_path, quiet_s=0, max_pending=0) as idx:
        await idx.replace_page("P", "hash-p", page_version("P", "p", 3))
        await idx.optimize()
        assert idx.builds.builds == 1 and not idx.builds.scheduled


async def test_closing_drops_a_build_still_waiting_and_does_not_wait_for_it(tmp_path: Path) -> None:
    async with _opened(tmp_path, quiet_s=3600, max_pending=1000) as idx:
        await idx.replace_page("P", "hash-p", page_version("P", "p", 3))
        await idx.optimize()
        assert idx.builds.scheduled
        started = time.monotonic()
        await idx.close()
        assert time.monotonic() - started < 30 and not idx.builds.scheduled and idx.builds.builds == 0
        assert idx.pid is None


async def test_a_failed_deferred_build_is_one_warning_and_its_points_still_wait(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def failing() -> bool:
        raise IndexError_("the index worker died during optimize")

    builds = QuietBuilds(failing, quiet_s=0.05, max_pending=100)
    builds.written(7)
    with caplog.at_level(logging.WARNING, logger="evident.index"):
        assert await builds.request() is False
        await asyncio.wait_for(builds.settled(), 10)
    assert builds.pending == 7 and builds.builds == 1
    assert [r.getMessage() for r in caplog.records] == [
        "deferred segment build failed: the index worker died during optimize (the next sync builds again)"
    ]


async def test_opening_schedules_a_build_for_what_an_earlier_process_left(tmp_path: Path) -> None:
    async with _opened(tmp_path, quiet_s=0.3, max_pending=1000) as idx:
        assert idx.builds.scheduled  # nothing written yet: a cheap optimize once quiet
        await asyncio.wait_for(idx.builds.settled(), 10)
        assert idx.builds.builds == 1


def test_a_cli_command_in_a_worker_builds_before_it_exits(tmp_path: Path) -> None:
    env = {"EVIDENT_DATA_DIR": str(tmp_path), "EVIDENT_INDEX_PROCESS": "yes"}
    index = make_index_from(Settings.load(env=env), serving=False)
    assert isinstance(index, ProcessEdgeIndex) and index.builds.quiet_s == 0


def test_serve_s_index_worker_takes_its_build_schedule_from_settings(tmp_path: Path) -> None:
    env = {"EVIDENT_DATA_DIR": str(tmp_path), "EVIDENT_INDEX_BUILD_QUIET_S": "7.5",
           "EVIDENT_INDEX_BUILD_MAX_PENDING": "1234"}
    index = make_index_from(Settings.load(env=env), serving=True)
    assert isinstance(index, ProcessEdgeIndex)
    assert (index.builds.quiet_s, index.builds.max_pending) == (7.5, 1234)
    default = make_index_from(Settings.load(env={"EVIDENT_DATA_DIR": str(tmp_path)}), serving=True)
    assert isinstance(default, ProcessEdgeIndex) and default.builds.quiet_s > 0
