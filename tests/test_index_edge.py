"""Qdrant Edge backend: the shared contract plus what only an on-disk embedded index has."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from evident.settings import Settings
from pipeline.access.scope import EVERYTHING
from pipeline.errors import ConfigError, IndexError_, IndexMismatchError
from pipeline.factory import make_index_from
from pipeline.index.edge import MANIFEST_FILE, EdgeIndex
from pipeline.index.edge_layout import EdgeLayout
from pipeline.index.edge_pages import PAGES_FILE, PageTable
from pipeline.index.edge_worker import ProcessEdgeIndex
from pipeline.types import IndexPoint, SearchRequest, SparseVector
from tests.index_access_contract import IndexAccessContract
from tests.index_contract import (
    DIM,
    EMBEDDER,
    QUERY_DENSE_T,
    QUERY_SPARSE,
    IndexContract,
    corpus_point,
    make_point,
    names,
    page_version,
)

pytestmark = pytest.mark.slow


class TestEdgeIndex(IndexContract, IndexAccessContract):
    gapless = True

    def make_index(self, tmp_path: Path) -> EdgeIndex:
        return EdgeIndex(tmp_path / "index")


class TestProcessEdgeIndex(IndexContract, IndexAccessContract):
    """The same index in a worker process (what ``evident serve`` uses)."""

    gapless = True
    streams_points = False

    def make_index(self, tmp_path: Path) -> ProcessEdgeIndex:
        return ProcessEdgeIndex(tmp_path / "index")


async def test_a_questions_batch_runs_each_ranker_once(tmp_path: Path) -> None:
    """Hybrid + each ranker's top hit (what a question asks): two engine queries, not three."""
    idx = EdgeIndex(tmp_path / "index")
    await idx.open(dense_dim=DIM, embedder=EMBEDDER)
    try:
        await idx.replace_page("P", "hash-v1", page_version("P", "v1", 6))
        calls: list[str] = []
        call = idx._call

        def counting(fn: Any, *args: Any) -> Any:
            calls.append(getattr(fn, "__name__", str(fn)))
            return call(fn, *args)

        idx._call = counting  # type: ignore[method-assign]
        hybrid = SearchRequest(dense=QUERY_DENSE_T, sparse=SparseVector((7,), (1.0,)), scope=EVERYTHING)
        found = await idx.search_many([hybrid, replace(hybrid, mode="lexical", limit=1),
                                       replace(hybrid, mode="dense", limit=1)])
        assert calls.count("query") == 2 and [len(hits) for hits in found] == [6, 1, 1]
        calls.clear()
        await idx.search_many([hybrid, replace(hybrid, mode="dense", limit=11)])  # deeper than the prefetch
        assert calls.count("query") == 2
    finally:
        await idx.close()


async def test_the_trace_file_times_each_request_and_a_failing_one_turns_it_off(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    trace = tmp_path / "trace.jsonl"
    idx = ProcessEdgeIndex(tmp_path / "index", trace_file=trace)
    await idx.open(dense_dim=DIM, embedder=EMBEDDER)
    try:
        await idx.replace_page("P", "hash-v1", page_version("P", "v1", 3))
        await asyncio.gather(*(idx.search(SearchRequest(dense=QUERY_DENSE_T, sparse=QUERY_SPARSE,
                                                        scope=EVERYTHING)) for _ in range(3)))
        await asyncio.gather(*(idx.count() for _ in range(3)))
        lines = [json.loads(line) for line in trace.read_text().splitlines()]
        assert [line["op"] for line in lines] == ["open", "replace_page", *["search"] * 3, *["count"] * 3]
        for line in lines:
            assert 0 <= line["exec_ms"] <= line["round_trip_ms"] and line["cpu_ms"] >= 0
        # questions wait for no other request (side by side: tests/test_index_worker_pipe.py); what they show
        # is the sender's hand-off
        assert all(0 <= line["queued_ms"] < 100 for line in lines[2:5])
        assert max(line["queued_ms"] for line in lines[5:]) > 0  # the third count waited for the others
        idx.trace_file = tmp_path  # a directory: the write fails
        assert await idx.count() == 3
        assert idx.trace_file is None and "index trace off" in caplog.text
    finally:
        await idx.close()


async def test_a_dead_index_worker_is_replaced_by_the_next_call(tmp_path: Path) -> None:
    """(The requests in flight when it dies fail: ``tests/test_index_worker_pipe.py``.)"""
    idx = ProcessEdgeIndex(tmp_path / "index")
    await idx.open(dense_dim=DIM, embedder=EMBEDDER)
    try:
        await idx.replace_page("P", "hash-p", page_version("P", "p", 3))
        assert idx.pid is not None and idx.worker_alive
        owner = json.loads((tmp_path / "index" / "lease.owner").read_text())
        assert owner["pid"] == idx.pid and owner["command"].endswith("(index worker)")
        os.kill(idx.pid, signal.SIGKILL)
        for _ in range(500):
            if not idx.worker_alive:
                break
            await asyncio.sleep(0.01)
        assert not idx.worker_alive
        assert await idx.count() == 3  # a new worker, the index opened again with the same arguments
        assert idx.restarts == 1
    finally:
        await idx.close()
    assert idx.pid is None


async def test_index_worker_errors_keep_their_class(tmp_path: Path) -> None:
    first = EdgeIndex(tmp_path / "index")
    await first.open(dense_dim=DIM, embedder=EMBEDDER)
    await first.close()
    idx = ProcessEdgeIndex(tmp_path / "index")
    try:
        with pytest.raises(IndexMismatchError, match="index"):
            await idx.open(dense_dim=DIM + 1, embedder=EMBEDDER)
    finally:
        await idx.close()


async def test_manifest_is_written_atomically(tmp_path: Path) -> None:
    idx = EdgeIndex(tmp_path / "index")
    await idx.open(dense_dim=DIM, embedder=EMBEDDER)
    await idx.close()
    files = sorted(p.name for p in (tmp_path / "index").iterdir() if not p.name.startswith("lease."))
    assert files == [MANIFEST_FILE, PAGES_FILE, "shard"]  # no temp files left behind
    data = json.loads((tmp_path / "index" / MANIFEST_FILE).read_text())
    assert data["embedder"] == EMBEDDER and data["dim"] == DIM


async def test_mismatch_message_names_the_directory(tmp_path: Path) -> None:
    idx = EdgeIndex(tmp_path / "index")
    await idx.open(dense_dim=DIM, embedder=EMBEDDER)
    await idx.close()
    with pytest.raises(IndexMismatchError) as err:
        await EdgeIndex(tmp_path / "index").open(dense_dim=768, embedder="big")
    assert str(err.value) == (
        f"index at {tmp_path / 'index'} was built with embedder '{EMBEDDER}' (dim {DIM}); this run uses "
        "'big' "
        "(dim 768): re-embed with `evident ingest --rebuild PATH` or `evident sync --rebuild`, or use "
        "another "
        "--index-dir / EVIDENT_COLLECTION"
    )


async def test_shard_without_manifest_is_still_checked(tmp_path: Path) -> None:
    idx = EdgeIndex(tmp_path / "index")
    await idx.open(dense_dim=DIM, embedder=EMBEDDER)
    await idx.replace_page("A", "hash-A", [corpus_point("A")])
    await idx.close()
    (tmp_path / "index" / MANIFEST_FILE).unlink()
    with pytest.raises(IndexMismatchError):
        await EdgeIndex(tmp_path / "index").open(dense_dim=DIM * 2, embedder=EMBEDDER)
    again = EdgeIndex(tmp_path / "index")
    await again.open(dense_dim=DIM, embedder=EMBEDDER)  # same dim: adopted, manifest rewritten
    assert await again.count() == 1
    await again.close()
    assert (tmp_path / "index" / MANIFEST_FILE).exists()


async def test_optimize_keeps_results_and_drop_empties(tmp_path: Path) -> None:
    idx = EdgeIndex(tmp_path / "index")
    await idx.open(dense_dim=DIM, embedder=EMBEDDER)
    for name in "ABCDEF":
        await idx.replace_page(name, f"hash-{name}", [corpus_point(name)])
    await idx.delete_pages(["F"])
    before = names(
        await idx.search(SearchRequest(dense=QUERY_DENSE_T, sparse=QUERY_SPARSE, scope=EVERYTHING))
    )
    await idx.optimize()
    assert (
        names(await idx.search(SearchRequest(dense=QUERY_DENSE_T, sparse=QUERY_SPARSE, scope=EVERYTHING)))
        == before
    )
    stats = await idx.stats()
    assert stats["disk_bytes"] > 0 and stats["backend"] == "qdrant-edge"
    await idx.drop()
    with pytest.raises(IndexError_, match="not open"):
        await idx.count()
    await idx.open(dense_dim=DIM * 2, embedder="other")  # dropped: any model may start afresh
    assert await idx.count() == 0
    await idx.close()


async def test_calls_before_open_fail_clearly(tmp_path: Path) -> None:
    idx = EdgeIndex(tmp_path / "index")
    with pytest.raises(IndexError_, match="call open"):
        await idx.search(
            SearchRequest(dense=None, sparse=SparseVector((1,), (1.0,)), mode="lexical", scope=EVERYTHING)
        )
    await idx.close()  # closing an unopened index is harmless


# ---------------------------------------------------------------- the page table (pages.sqlite)


async def _two_pages(path: Path) -> None:
    idx = EdgeIndex(path)
    await idx.open(dense_dim=DIM, embedder=EMBEDDER)
    await idx.replace_page("P", "hash-p", page_version("P", "p", 3))
    await idx.replace_page("Q", "hash-q", page_version("Q", "q", 2))
    await idx.close()


async def test_page_hashes_come_from_the_page_table(tmp_path: Path) -> None:
    await _two_pages(tmp_path / "index")
    table = PageTable(tmp_path / "index")
    assert table.open() is True
    table.settle("Q", "hash-from-table", "S9")
    table.close()
    idx = EdgeIndex(tmp_path / "index")
    await idx.open(dense_dim=DIM, embedder=EMBEDDER)
    try:  # no scroll of the shard: what the table says is what the index reports
        assert await idx.page_hashes() == {"P": "hash-p", "Q": "hash-from-table"}
        assert (await idx.page_spaces())["Q"] == "S9"
    finally:
        await idx.close()


@pytest.mark.parametrize("damage", ["missing", "garbage", "incomplete"])
async def test_a_missing_or_damaged_page_table_is_rebuilt_from_the_shard(tmp_path: Path, damage: str) -> None:
    await _two_pages(tmp_path / "index")
    table_file = tmp_path / "index" / PAGES_FILE
    if damage == "missing":
        table_file.unlink()
    elif damage == "garbage":
        table_file.write_bytes(b"not a database at all" * 100)
    else:  # a rebuild that was cut off: rows but no completion mark
        db = sqlite3.connect(table_file)
        db.execute("DELETE FROM meta")
        db.execute("DELETE FROM pages WHERE page_id = 'Q'")
        db.commit()
        db.close()
    idx = EdgeIndex(tmp_path / "index")
    await idx.open(dense_dim=DIM, embedder=EMBEDDER)
    try:
        assert await idx.page_hashes() == {"P": "hash-p", "Q": "hash-q"}
        assert await idx.page_spaces() == {"P": "ENG", "Q": "ENG"}
    finally:
        await idx.close()


async def test_pending_rows_left_by_a_crash_are_settled_from_the_shard(tmp_path: Path) -> None:
    """A process killed between marking and settling: the shard decides (kept, changed or gone)."""
    await _two_pages(tmp_path / "index")
    table = PageTable(tmp_path / "index")
    table.open()
    table.mark_pending(["P", "Q", "GONE"])  # GONE: killed before its first points were written
    table.close()
    idx = EdgeIndex(tmp_path / "index")
    await idx.open(dense_dim=DIM, embedder=EMBEDDER)
    try:
        assert await idx.page_hashes() == {"P": "hash-p", "Q": "hash-q"}
        await idx.delete_pages(["Q"])
        assert await idx.page_hashes() == {"P": "hash-p"}
        await idx.replace_page("P", "hash-p2", [])
        assert await idx.page_hashes() == {}
    finally:
        await idx.close()


@pytest.mark.parametrize(("every", "left_for_optimize"), [(15, False), (1_000, True)])
async def test_writes_index_segments_as_they_fill(
    tmp_path: Path, every: int, left_for_optimize: bool
) -> None:
    """Past ``optimize_every_points`` the write itself builds the filled segment; ``optimize()`` finds less to
    do."""
    layout = EdgeLayout(optimize_every_points=every, indexing_threshold_kb=1)
    idx = EdgeIndex(tmp_path / "index", layout=layout)
    await idx.open(dense_dim=DIM, embedder=EMBEDDER)
    try:
        for page in ("P", "Q", "R"):
            await idx.replace_page(page, f"hash-{page}", page_version(page, page, 10))
        assert await idx.optimize() is left_for_optimize
        hits = await idx.search(
            SearchRequest(
                dense=QUERY_DENSE_T, sparse=None, mode="dense", dense_k=10, limit=10, scope=EVERYTHING
            )
        )
        assert sorted({h.evidence.page_id for h in hits}) == ["P", "Q", "R"]
    finally:
        await idx.close()


async def test_a_sync_of_some_pages_leaves_the_built_segments_alone(tmp_path: Path) -> None:
    """Pages rewritten after a build: their new points become a segment of their own, and the segment holding
    the untouched pages is neither merged nor rebuilt although a quarter of it is now deleted (in serve every
    search waits for such a build)."""
    await _sync_two_pages_of_eight(tmp_path, EdgeLayout(indexing_threshold_kb=1), rebuilt=False)


@pytest.mark.parametrize("layout", [{"segment_number": 0}, {"segment_number": 8, "deleted_threshold": 0.2}])
async def test_the_earlier_layouts_rebuilt_the_built_segments(tmp_path: Path, layout: dict[str, Any]) -> None:
    """Edge's own segment number (2 on this machine) merges; Qdrant's 20 % vacuums: what the test above
    rules out."""
    if layout.get("segment_number") == 0 and (os.cpu_count() or 1) > 4:
        pytest.skip("Edge's own choice is one segment per CPU: it merges less on a larger machine")
    await _sync_two_pages_of_eight(tmp_path, EdgeLayout(indexing_threshold_kb=1, **layout), rebuilt=True)


def _many(page_id: str, version: str) -> list[IndexPoint]:
    return [make_point(page_id, i, f"hash-{version}", f"{version} {i}", cosine=0.9 - 0.001 * i)
            for i in range(300)]


async def _sync_two_pages_of_eight(tmp_path: Path, layout: EdgeLayout, *, rebuilt: bool) -> None:
    idx = EdgeIndex(tmp_path / "index", layout=layout)

    def segments() -> set[str]:
        return {p.name for p in (tmp_path / "index").rglob("segments/*") if p.is_dir()}

    await idx.open(dense_dim=DIM, embedder=EMBEDDER)
    try:
        for page in "ABCDEFGH":  # segments over Edge's 1,000-vector floor for a vacuum
            await idx.replace_page(page, f"hash-{page}", _many(page, page))
        await idx.optimize()
        built = segments()
        for page in "AB":  # a quarter of the points
            await idx.replace_page(page, f"hash-{page}2", _many(page, f"{page}2"))
        await idx.optimize()
        assert not (built & segments()) if rebuilt else built & segments()
        hits = await idx.search(SearchRequest(dense=QUERY_DENSE_T, sparse=None, mode="dense", dense_k=2400,
                                              limit=2400, scope=EVERYTHING))
        assert len(hits) == 2400
        assert {h.evidence.text.split()[0] for h in hits if h.evidence.page_id in "AB"} == {"A2", "B2"}
    finally:
        await idx.close()


@pytest.mark.parametrize(("setting", "serving", "in_worker"), [
    ("auto", True, True), ("auto", False, False), ("yes", False, True), ("no", True, False),
])
def test_serving_processes_get_the_index_in_a_worker(
    tmp_path: Path, setting: str, serving: bool, in_worker: bool
) -> None:
    settings = Settings.load(env={"EVIDENT_DATA_DIR": str(tmp_path), "EVIDENT_INDEX_PROCESS": setting})
    index = make_index_from(settings, serving=serving)
    assert isinstance(index, ProcessEdgeIndex if in_worker else EdgeIndex)
    assert index.path == settings.core.resolved_index_dir


def test_index_process_setting_is_validated(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="EVIDENT_INDEX_PROCESS"):
        Settings.load(env={"EVIDENT_DATA_DIR": str(tmp_path), "EVIDENT_INDEX_PROCESS": "sometimes"})


async def test_readiness_does_not_queue_behind_a_segment_build_in_the_worker(tmp_path: Path) -> None:
    """While the worker optimizes (here: stopped mid-request), the readiness check answers at once."""
    idx = ProcessEdgeIndex(tmp_path / "index")
    await idx.open(dense_dim=DIM, embedder=EMBEDDER)
    try:
        await idx.replace_page("P", "hash-p", page_version("P", "p", 3))
        await idx.ready()  # idle: a real count
        assert idx.pid is not None and idx.busy is None
        os.kill(idx.pid, signal.SIGSTOP)
        try:
            building = asyncio.create_task(idx.optimize())
            for _ in range(500):  # the request reaches the (stopped) worker
                if idx.busy is not None:
                    break
                await asyncio.sleep(0.01)
            assert idx.busy is not None and idx.busy[0] == "optimize"
            await asyncio.wait_for(idx.ready(), timeout=2)  # does not wait for the worker
            counting = asyncio.create_task(idx.count())
            await asyncio.sleep(0.2)
            assert not counting.done()  # a real request would have waited
        finally:
            os.kill(idx.pid, signal.SIGCONT)
        await building
        assert await counting == 3 and idx.busy is None
    finally:
        await idx.close()


@pytest.mark.parametrize("cls", [EdgeIndex, ProcessEdgeIndex])
async def test_a_snapshot_restores_into_another_directory(tmp_path: Path, cls: type) -> None:
    """Backup and restore through either form of the embedded index (the worker once refused both)."""
    idx = cls(tmp_path / "index")
    await idx.open(dense_dim=DIM, embedder=EMBEDDER)
    try:
        await idx.replace_page("P", "hash-p", page_version("P", "p", 3))
        done = await idx.snapshot(tmp_path / "backup")
        assert done["backend"] == "qdrant-edge" and int(done["files"]) > 0
    finally:
        await idx.close()
    again = cls(tmp_path / "restored")
    try:
        await again.restore(tmp_path / "backup")
        await again.open(dense_dim=DIM, embedder=EMBEDDER)
        assert await again.count() == 3 and await again.page_hashes() == {"P": "hash-p"}
    finally:
        await again.close()


async def test_a_manifest_whose_recipe_is_not_an_object_takes_the_next_one(tmp_path: Path) -> None:
    """A recipe that cannot be read counts as none, for adopting as for checking (as on a server)."""
    idx = EdgeIndex(tmp_path / "i")
    await idx.open(dense_dim=DIM, embedder=EMBEDDER)
    await idx.close()
    manifest = tmp_path / "i" / MANIFEST_FILE
    manifest.write_text(json.dumps({**json.loads(manifest.read_text()), "recipe": "oops"}))
    again = EdgeIndex(tmp_path / "i")
    await again.open(dense_dim=DIM, embedder=EMBEDDER, recipe={"max_tokens": 128})
    try:
        assert await again.recipe() == {"max_tokens": 128}
    finally:
        await again.close()
