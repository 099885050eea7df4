"""Several processes on one embedded index: the lease is handed over instead of failing on Edge's WAL lock."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from helpers import HashEmbedder, ingest_folder

from connectors.local import sample_space_dir
from pipeline.access.scope import EVERYTHING
from pipeline.errors import IndexBusyError
from pipeline.index.edge import EdgeIndex
from pipeline.index.lease import OWNER_FILE, WAITING_DIR, IndexLease, describe_process
from pipeline.types import SearchRequest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent


def test_second_holder_waits_then_names_the_holder(tmp_path: Path) -> None:
    first = IndexLease(tmp_path, command="evident ingest")
    first.acquire()
    notes: list[str] = []
    second = IndexLease(tmp_path, command="evident search", wait_s=0.8, notify=notes.append)
    with pytest.raises(
        IndexBusyError, match=r"in use by `evident ingest` \(pid \d+\) since .*EVIDENT_INDEX_WAIT_S"
    ):
        second.acquire()
    assert notes and "waiting for the index" in notes[0] and "`evident ingest`" in notes[0]
    assert not list((tmp_path / WAITING_DIR).iterdir())  # the marker goes with the waiter
    first.release()
    second.acquire()
    assert second.held and '"evident search"' in (tmp_path / OWNER_FILE).read_text()


def test_holder_sees_waiters_and_ignores_dead_ones(tmp_path: Path) -> None:
    holder = IndexLease(tmp_path)
    holder.acquire()
    (tmp_path / WAITING_DIR).mkdir()
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    (tmp_path / WAITING_DIR / f"{dead.stdout.strip()}-deadbeef").touch()
    assert not holder.others_waiting()
    assert not list((tmp_path / WAITING_DIR).iterdir())  # the stale marker is swept
    (tmp_path / WAITING_DIR / f"{os.getppid()}-cafebabe").touch()  # a live process
    assert holder.others_waiting()


def test_after_yielding_the_waiters_go_first(tmp_path: Path) -> None:
    holder = IndexLease(tmp_path)
    holder.acquire()
    (tmp_path / WAITING_DIR).mkdir()
    marker = tmp_path / WAITING_DIR / f"{os.getppid()}-feedface"
    marker.touch()
    holder.release(yielding=True)
    start = time.monotonic()
    holder.wait_s = 0.3
    with pytest.raises(IndexBusyError):  # the lock is free, but the waiter we yielded to goes first
        holder.acquire()
    marker.unlink()  # the waiter got its turn
    holder.wait_s = 5.0
    holder.acquire()
    assert holder.held and time.monotonic() - start < 5


def test_describe_process_names_the_subcommand(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "argv", ["/venv/bin/evident", "-v", "ingest", "docs/"])
    assert describe_process() == "evident ingest"


async def test_two_indexes_on_one_directory_take_turns(tmp_path: Path) -> None:
    embedder = HashEmbedder()
    index_dir = tmp_path / "index"
    first, _, _ = await ingest_folder(index_dir, sample_space_dir(), embedder=embedder)
    before = await first.count()
    second = EdgeIndex(index_dir, wait_s=10)
    await second.open(dense_dim=embedder.dim, embedder=embedder.name)  # first idles: its watcher hands over
    assert await second.count() == before
    assert first.handovers == 1
    request = SearchRequest(
        dense=tuple(embedder.embed_queries(["on-call"])[0]),
        sparse=None,
        mode="dense",
        limit=3,
        scope=EVERYTHING,
    )
    hits, _ = await asyncio.gather(first.search(request), second.search(request))  # both get their turn
    assert len(hits) == 3
    await second.delete_pages([hits[0].evidence.page_id])
    assert await first.count() < before  # first reopened the shard and sees second's write
    await second.close()
    await first.close()


async def test_concurrent_operations_after_a_hand_over_take_the_lease_back_once(tmp_path: Path) -> None:
    """Two searches at once (confidence runs two) on a handed-over shard: one re-acquires, the other uses it.
    Before, each opened its own lock fd, and the second waited on the first's lock, its own process's."""
    embedder = HashEmbedder()
    index_dir = tmp_path / "index"
    first, _, _ = await ingest_folder(index_dir, sample_space_dir(), embedder=embedder)
    first._shared.lease.wait_s = 3.0
    other = IndexLease(index_dir, command="another process", wait_s=10)
    await asyncio.to_thread(other.acquire)  # first idles: its watcher hands over
    assert first.handovers == 1
    request = SearchRequest(
        dense=tuple(embedder.embed_queries(["on-call"])[0]),
        sparse=None,
        mode="dense",
        limit=3,
        scope=EVERYTHING,
    )
    searches = asyncio.gather(*(first.search(request) for _ in range(3)))
    await asyncio.sleep(0.3)  # all three wait for the lease
    other.release()
    results = await searches
    assert [len(hits) for hits in results] == [3, 3, 3]
    await first.close()


HOLDER = textwrap.dedent("""
    import asyncio, sys, time
    sys.path[:0] = [{tests!r}, {repo!r}]
    from helpers import HashEmbedder
    from pipeline.index.edge import EdgeIndex
    from pipeline.access.scope import EVERYTHING
    from pipeline.types import SearchRequest

    async def main():
        emb = HashEmbedder()
        idx = EdgeIndex({index!r}, command="test holder")
        await idx.open(dense_dim=emb.dim, embedder=emb.name)
        print("open", await idx.count(), flush=True)
        sys.stdin.readline()  # idle, holding the index, until the test says go on
        query = tuple(emb.embed_queries(["release"])[0])
        req = SearchRequest(dense=query, sparse=None, scope=EVERYTHING, mode="dense", limit=2)
        print("after", len(await idx.search(req)), await idx.count(), idx.handovers, flush=True)
        await idx.close()

    asyncio.run(main())
""")


async def test_real_processes_share_the_index(tmp_path: Path) -> None:
    embedder = HashEmbedder()
    index_dir = tmp_path / "index"
    idx, _, _ = await ingest_folder(index_dir, sample_space_dir(), embedder=embedder)
    total = await idx.count()
    await idx.close()
    script = HOLDER.format(tests=str(REPO / "tests"), repo=str(REPO), index=str(index_dir))
    holder = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        script,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert holder.stdout is not None
        first_line = await asyncio.wait_for(holder.stdout.readline(), 60)
        assert first_line.decode().split() == ["open", str(total)]
        mine = EdgeIndex(index_dir, wait_s=20)
        await mine.open(dense_dim=embedder.dim, embedder=embedder.name)  # the other process holds it: we wait
        assert await mine.count() == total
        await mine.delete_pages(["100001"])
        remaining = await mine.count()
        await mine.close()
        out, err = await asyncio.wait_for(holder.communicate(b"go\n"), 30)
    finally:
        if holder.returncode is None:
            holder.kill()
    assert holder.returncode == 0, err.decode()
    assert out.decode().split() == ["after", "2", str(remaining), "1"]  # it reopened and saw our delete
