"""qdrant-client backend (local mode, on disk): the shared contract plus server-backend specifics."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from pathlib import Path
from typing import TypeVar

import pytest

from pipeline.access.scope import EVERYTHING
from pipeline.errors import ConfigError, IndexError_, IndexMismatchError
from pipeline.index.migrate import migrate_index
from pipeline.index.qdrant import METADATA_KEY, QdrantServerIndex
from pipeline.types import SearchRequest
from tests.index_access_contract import IndexAccessContract
from tests.index_contract import (
    CORPUS,
    DIM,
    EMBEDDER,
    QUERY_DENSE_T,
    QUERY_SPARSE,
    IndexContract,
    corpus_point,
    names,
)

T = TypeVar("T")


class RemoteLikeIndex(QdrantServerIndex):
    """Local mode never yields to the event loop; a server round trip does. Yield before every call
    so concurrent searches interleave with each step of a write, as they would against a server."""

    async def _do(self, call: Awaitable[T]) -> T:
        await asyncio.sleep(0)  # request in flight
        result = await super()._do(call)
        await asyncio.sleep(0)  # response in flight
        return result


class TestQdrantServerIndex(IndexContract, IndexAccessContract):
    gapless = False  # old-only, then briefly nothing, then new-only

    def make_index(self, tmp_path: Path) -> QdrantServerIndex:
        return RemoteLikeIndex(path=tmp_path / "qdrant", collection="evident_test")


def test_needs_exactly_one_location(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="exactly one"):
        QdrantServerIndex()
    with pytest.raises(ConfigError, match="exactly one"):
        QdrantServerIndex(url="http://127.0.0.1:6333", path=tmp_path)


async def test_manifest_lives_in_collection_metadata() -> None:
    idx = QdrantServerIndex(location=":memory:")
    await idx.open(dense_dim=DIM, embedder=EMBEDDER)
    try:
        client = idx._require()
        info = await client.get_collection("evident")
        assert info.config.metadata[METADATA_KEY]["embedder"] == EMBEDDER
        assert info.config.metadata[METADATA_KEY]["dim"] == DIM
    finally:
        await idx.close()


@pytest.mark.parametrize("weights", [None, (0.2, 1.0), (3.0, 1.0)])
async def test_client_side_fusion_matches_engine_fusion(weights: tuple[float, float] | None) -> None:
    idx = QdrantServerIndex(location=":memory:")
    await idx.open(dense_dim=DIM, embedder=EMBEDDER)
    try:
        for name in CORPUS:
            await idx.replace_page(name, f"hash-{name}", [corpus_point(name)])
        req = SearchRequest(dense=QUERY_DENSE_T, sparse=QUERY_SPARSE, weights=weights, scope=EVERYTHING)
        engine = await idx.search(req)
        idx.engine_fusion = False
        client = await idx.search(req)
        assert names(client) == names(engine)
        assert [h.score for h in client] == pytest.approx([h.score for h in engine], rel=1e-5)
        assert [h.rank for h in client] == list(range(1, len(CORPUS) + 1))
    finally:
        await idx.close()


async def test_a_collection_made_by_hand_adopts_the_first_recipe(tmp_path: Path) -> None:
    """A collection created outside evident (no metadata) records the recipe of the first open that gives
    one, so vectors made otherwise are refused afterwards, as an embedded index refuses them."""
    from qdrant_client import AsyncQdrantClient, models

    client = AsyncQdrantClient(path=str(tmp_path / "q"))
    await client.create_collection(
        "evident", vectors_config={"dense": models.VectorParams(size=DIM, distance=models.Distance.COSINE)},
        sparse_vectors_config={"sparse": models.SparseVectorParams(modifier=models.Modifier.IDF)})
    await client.close()
    idx = QdrantServerIndex(path=tmp_path / "q")
    await idx.open(dense_dim=DIM, embedder=EMBEDDER, recipe={"max_tokens": 128})
    assert await idx.recipe() == {"max_tokens": 128}
    await idx.close()
    again = QdrantServerIndex(path=tmp_path / "q")
    with pytest.raises(IndexMismatchError, match="made with max_tokens 128"):
        await again.open(dense_dim=DIM, embedder=EMBEDDER, recipe={"max_tokens": 64})


async def test_migrate_between_collections_takes_the_recipe(tmp_path: Path) -> None:
    """A server-to-server `index migrate` gives the destination the source collection's recipe."""
    recipe = {"max_tokens": 128, "sparse": "bm25(avg_len=88.0)", "sparse_idf": True}
    source = QdrantServerIndex(path=tmp_path / "q", collection="old")
    await source.open(dense_dim=DIM, embedder=EMBEDDER, recipe=recipe)
    for name in CORPUS:
        await source.replace_page(name, f"hash-{name}", [corpus_point(name)])
    try:
        report = await migrate_index(source, QdrantServerIndex(path=tmp_path / "q2", collection="new"),
                                     dim=DIM, embedder=EMBEDDER, verify=0)
    finally:
        await source.close()
    assert report.pages_copied == len(CORPUS)
    dest = QdrantServerIndex(path=tmp_path / "q2", collection="new")
    with pytest.raises(IndexMismatchError, match="max_tokens 128"):  # the copy records the source's recipe
        await dest.open(dense_dim=DIM, embedder=EMBEDDER, recipe={**recipe, "max_tokens": 64})


async def test_adopting_a_recipe_checks_how_the_collection_scores_sparse_vectors(tmp_path: Path) -> None:
    """A hand-made collection that applies IDF is not recorded as one that does not (learned sparse weights):
    the recipe would be false, and a migration would copy it into a collection scoring otherwise."""
    from qdrant_client import AsyncQdrantClient, models

    client = AsyncQdrantClient(path=str(tmp_path / "q"))
    await client.create_collection(
        "evident", vectors_config={"dense": models.VectorParams(size=DIM, distance=models.Distance.COSINE)},
        sparse_vectors_config={"sparse": models.SparseVectorParams(modifier=models.Modifier.IDF)},
        metadata={"other": 1})
    await client.close()
    idx = QdrantServerIndex(path=tmp_path / "q")
    with pytest.raises(IndexMismatchError, match="with IDF; this run's sparse encoder needs them without"):
        await idx.open(dense_dim=DIM, embedder=EMBEDDER, recipe={"sparse": "bge-m3", "sparse_idf": False})
    await idx.open(dense_dim=DIM, embedder=EMBEDDER, recipe={"sparse": "bm25", "sparse_idf": True})
    try:
        assert await idx.recipe() == {"sparse": "bm25", "sparse_idf": True}
        info = await idx._require().get_collection("evident")
        assert info.config.metadata["other"] == 1  # the rest of the metadata stays
    finally:
        await idx.close()


async def test_metadata_that_is_not_an_object_is_an_index_error(tmp_path: Path) -> None:
    from qdrant_client import AsyncQdrantClient, models

    client = AsyncQdrantClient(path=str(tmp_path / "q"))
    await client.create_collection(
        "evident", vectors_config={"dense": models.VectorParams(size=DIM, distance=models.Distance.COSINE)},
        metadata={METADATA_KEY: "oops"})
    await client.close()
    with pytest.raises(IndexError_, match="metadata 'evident' is not an object"):
        await QdrantServerIndex(path=tmp_path / "q").open(dense_dim=DIM, embedder=EMBEDDER)
