"""The index worker answers a question beside a write (``pipeline.runtime.request_pipe``): what that changes,
and every way it can end."""

from __future__ import annotations

import asyncio
import fcntl
import os
import signal
from pathlib import Path

import pytest

from pipeline.access.scope import EVERYTHING
from pipeline.errors import IndexBusyError, IndexError_
from pipeline.index.edge_worker import ProcessEdgeIndex
from pipeline.index.lease import LOCK_FILE
from pipeline.types import IndexPoint, SearchRequest
from tests.index_contract import DIM, EMBEDDER, QUERY_DENSE_T, QUERY_SPARSE, make_point, names, page_version

pytestmark = pytest.mark.slow
QUESTION = SearchRequest(dense=QUERY_DENSE_T, sparse=QUERY_SPARSE, scope=EVERYTHING)


def _big_page(n: int = 8000) -> list[IndexPoint]:
    """A page whose write takes the worker a second or so (many upsert steps)."""
    return [make_point("BIG", i, "hash-big", f"big {i}", cosine=0.1, sparse={9: 1.0}) for i in range(n)]


async def _sent(idx: ProcessEdgeIndex, op: str) -> None:
    for _ in range(1000):
        if idx.busy is not None and idx.busy[0] == op:
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"{op} never reached the worker")


async def test_a_question_is_answered_while_a_page_write_is_in_the_worker(tmp_path: Path) -> None:
    """A search used to wait for the whole of the write in front of it (serve during a sync)."""
    idx = ProcessEdgeIndex(tmp_path / "index")
    await idx.open(dense_dim=DIM, embedder=EMBEDDER)
    try:
        await idx.replace_page("P", "hash-p1", page_version("P", "p1", 3))
        writing = asyncio.create_task(idx.replace_page("BIG", "hash-big", _big_page()))
        await _sent(idx, "replace_page")
        hits = await idx.search(QUESTION)
        assert not writing.done()  # answered between the write's steps
        assert set(names(hits)) == {"P"}  # the live page, nothing of the half-written one
        await writing
        assert await idx.count() == 8003
    finally:
        await idx.close()


async def test_writes_and_other_requests_still_go_one_at_a_time_in_order(tmp_path: Path) -> None:
    idx = ProcessEdgeIndex(tmp_path / "index")
    await idx.open(dense_dim=DIM, embedder=EMBEDDER)
    try:
        writing = asyncio.create_task(idx.replace_page("BIG", "hash-big", _big_page(3000)))
        await _sent(idx, "replace_page")
        deleting = asyncio.create_task(idx.delete_pages(["BIG"]))
        counting = asyncio.create_task(idx.count())
        await asyncio.sleep(0.05)
        assert not deleting.done() and not counting.done()
        await writing
        await deleting
        assert await counting == 0  # after the delete that was asked before it
    finally:
        await idx.close()


async def test_a_worker_that_dies_fails_every_request_in_flight_and_the_next_one_reopens(
        tmp_path: Path) -> None:
    idx = ProcessEdgeIndex(tmp_path / "index")
    await idx.open(dense_dim=DIM, embedder=EMBEDDER)
    try:
        await idx.replace_page("P", "hash-p1", page_version("P", "p1", 3))
        assert idx.pid is not None
        os.kill(idx.pid, signal.SIGSTOP)  # the requests below wait in the worker
        writing = asyncio.create_task(idx.replace_page("Q", "hash-q1", page_version("Q", "q1", 2)))
        searching = asyncio.create_task(idx.search(QUESTION))
        await _sent(idx, "replace_page")
        await asyncio.sleep(0.1)
        os.kill(idx.pid, signal.SIGKILL)
        for task in (writing, searching):
            with pytest.raises(IndexError_, match=r"index worker .* died .* during (replace_page|search)"):
                await asyncio.wait_for(task, 30)
        assert set(names(await idx.search(QUESTION))) == {"P"}  # a new worker, reopened
        assert idx.restarts == 1
    finally:
        await idx.close()
    assert idx.pid is None


async def test_a_cancelled_question_leaves_the_worker_in_step(tmp_path: Path) -> None:
    """Its reply, when it comes, is dropped; the requests after it get their own."""
    idx = ProcessEdgeIndex(tmp_path / "index")
    await idx.open(dense_dim=DIM, embedder=EMBEDDER)
    try:
        await idx.replace_page("P", "hash-p1", page_version("P", "p1", 3))
        writing = asyncio.create_task(idx.replace_page("BIG", "hash-big", _big_page(3000)))
        await _sent(idx, "replace_page")
        searching = asyncio.create_task(idx.search(QUESTION))
        await asyncio.sleep(0)
        searching.cancel()
        with pytest.raises(asyncio.CancelledError):
            await searching
        await writing
        assert await idx.count() == 3003
        assert names(await idx.search(QUESTION))[:3] == ["P"] * 3
    finally:
        await idx.close()


async def test_closing_waits_for_the_questions_in_flight(tmp_path: Path) -> None:
    idx = ProcessEdgeIndex(tmp_path / "index")
    await idx.open(dense_dim=DIM, embedder=EMBEDDER)
    await idx.replace_page("P", "hash-p1", page_version("P", "p1", 3))
    searches = [asyncio.create_task(idx.search(QUESTION)) for _ in range(5)]
    await asyncio.sleep(0)
    await idx.close()
    for task in searches:
        assert set(names(await task)) == {"P"}
    assert idx.pid is None


async def _killed_and_held(idx: ProcessEdgeIndex, tmp_path: Path) -> int:
    """A page written, the worker killed, and the index's lease held by a bare lock (as another process
    would hold it; it hands nothing over): the descriptor that holds it."""
    await idx.replace_page("P", "hash-p1", page_version("P", "p1", 3))
    assert idx.pid is not None
    os.kill(idx.pid, signal.SIGKILL)
    for _ in range(500):
        if not idx.worker_alive:
            break
        await asyncio.sleep(0.01)
    fd = os.open(tmp_path / "index" / LOCK_FILE, os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


async def test_a_reopen_that_fails_leaves_no_worker_and_the_next_call_tries_again(tmp_path: Path) -> None:
    """A worker whose reopen failed used to stay, never opened: every later call failed until a restart."""
    idx = ProcessEdgeIndex(tmp_path / "index", wait_s=0.5)
    await idx.open(dense_dim=DIM, embedder=EMBEDDER)
    try:
        fd = await _killed_and_held(idx, tmp_path)
        try:
            with pytest.raises(IndexBusyError):
                await idx.count()
            assert not idx.worker_alive and idx.pid is None
        finally:
            os.close(fd)
        assert await idx.count() == 3
        assert idx.restarts == 1
    finally:
        await idx.close()


async def test_a_closed_index_starts_no_worker_until_opened_again(tmp_path: Path) -> None:
    idx = ProcessEdgeIndex(tmp_path / "index")
    await idx.open(dense_dim=DIM, embedder=EMBEDDER)
    await idx.replace_page("P", "hash-p1", page_version("P", "p1", 3))
    await idx.close()
    with pytest.raises(IndexError_, match="not open; call open"):
        await idx.search(QUESTION)
    assert idx.pid is None
    await idx.open(dense_dim=DIM, embedder=EMBEDDER)
    try:
        assert await idx.count() == 3
    finally:
        await idx.close()


async def test_a_question_cancelled_during_a_reopen_keeps_the_reopened_worker(tmp_path: Path) -> None:
    """The reopen used to be undone: the new child, opened fine, was stopped because its caller had gone
    (every question cancelled while the shard loaded cost a whole reopen)."""
    idx = ProcessEdgeIndex(tmp_path / "index", wait_s=30)
    await idx.open(dense_dim=DIM, embedder=EMBEDDER)
    try:
        fd = await _killed_and_held(idx, tmp_path)
        searching = asyncio.create_task(idx.search(QUESTION))
        for _ in range(500):
            if idx.pid is not None:
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.2)
        searching.cancel()
        os.close(fd)
        with pytest.raises(asyncio.CancelledError):
            await searching
        assert idx.worker_alive and idx.restarts == 1  # kept: the next call needs no start
        pid = idx.pid
        assert await idx.count() == 3 and idx.pid == pid and idx.restarts == 1
    finally:
        await idx.close()
