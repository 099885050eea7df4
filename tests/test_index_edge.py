"""Qdrant Edge backend: the shared contract plus what only an on-disk embedded index has."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.errors import IndexError_, IndexMismatchError
from pipeline.index.edge import MANIFEST_FILE, EdgeIndex
from pipeline.types import SearchRequest, SparseVector
from tests.index_contract import (
    DIM,
    EMBEDDER,
    QUERY_DENSE_T,
    QUERY_SPARSE,
    IndexContract,
    corpus_point,
    names,
)


class TestEdgeIndex(IndexContract):
    gapless = True

    def make_index(self, tmp_path: Path) -> EdgeIndex:
        return EdgeIndex(tmp_path / "index")


async def test_manifest_is_written_atomically(tmp_path: Path) -> None:
    idx = EdgeIndex(tmp_path / "index")
    await idx.open(dense_dim=DIM, embedder=EMBEDDER)
    await idx.close()
    files = sorted(p.name for p in (tmp_path / "index").iterdir() if not p.name.startswith("lease."))
    assert files == [MANIFEST_FILE, "shard"]  # no temp files left behind
    data = json.loads((tmp_path / "index" / MANIFEST_FILE).read_text())
    assert data["embedder"] == EMBEDDER and data["dim"] == DIM


async def test_mismatch_message_names_the_directory(tmp_path: Path) -> None:
    idx = EdgeIndex(tmp_path / "index")
    await idx.open(dense_dim=DIM, embedder=EMBEDDER)
    await idx.close()
    with pytest.raises(IndexMismatchError) as err:
        await EdgeIndex(tmp_path / "index").open(dense_dim=768, embedder="big")
    assert str(err.value) == (
        f"index at {tmp_path / 'index'} was built with embedder '{EMBEDDER}' (dim {DIM}); this run uses 'big' "
        "(dim 768): re-embed with `evident ingest --rebuild PATH` or `evident sync --rebuild`, or use another "
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
    before = names(await idx.search(SearchRequest(dense=QUERY_DENSE_T, sparse=QUERY_SPARSE)))
    await idx.optimize()
    assert names(await idx.search(SearchRequest(dense=QUERY_DENSE_T, sparse=QUERY_SPARSE))) == before
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
        await idx.search(SearchRequest(dense=None, sparse=SparseVector((1,), (1.0,)), mode="lexical"))
    await idx.close()  # closing an unopened index is harmless
