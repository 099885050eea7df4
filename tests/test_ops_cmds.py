"""`evident backup` / `restore` / `index migrate` through the CLI, on a real Edge index and SQLite store.

The index is built once per test through the Python API with a tiny hash embedder (no model), then the
commands run through click's CliRunner with ``EVIDENT_DATA_DIR`` pointing at a temp directory.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import shutil
import sqlite3
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner, Result
from helpers import ingest_options

from connectors.local import LocalFolderConnector, sample_space_dir
from evident.cli import main
from pipeline.access.scope import EVERYTHING
from pipeline.answer.retrieve import retrieve
from pipeline.answer.settings import RetrievalSettings
from pipeline.errors import IndexMismatchError
from pipeline.index.edge import EdgeIndex
from pipeline.index.files import copy_sparse
from pipeline.index.migrate import same_ranking
from pipeline.index.qdrant import QdrantServerIndex
from pipeline.ingest.contextualize import contextualize
from pipeline.ingest.run import ingest_pages
from pipeline.models.sparse import Bm25Encoder
from pipeline.store import Store
from pipeline.turns import TurnRecord
from pipeline.types import Evidence, Hit, IndexPoint, SparseVector

QUERIES = ("Who is on call this week?", "deployment rollback steps", "artifact store outage root cause",
           "release versioning policy", "hardware inventory rack")


class BowEmbedder:
    """Deterministic hashed bag of words, 48-d, L2-normalised: similar texts get similar vectors."""

    name = "test-bow-48"
    dim = 48

    def embed_documents(self, texts: Sequence[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for row, text in enumerate(texts):
            for word in re.findall(r"\w+", text.lower()):
                out[row, int.from_bytes(hashlib.md5(word.encode()).digest()[:4], "little") % self.dim] += 1.0
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        return out / np.clip(norms, 1e-9, None)

    def close(self) -> None:
        pass

    def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        return self.embed_documents(texts)


async def _build_index(index_dir: Path) -> int:
    embedder = BowEmbedder()
    index = EdgeIndex(index_dir)
    await index.open(dense_dim=embedder.dim, embedder=embedder.name)
    try:
        report = await ingest_pages(LocalFolderConnector([sample_space_dir()]).iter_pages(), index=index,
                                    embedder=embedder, sparse=Bm25Encoder(), options=ingest_options())
        assert not report.failed
        return await index.count()
    finally:
        await index.close()


async def _state(index: EdgeIndex | QdrantServerIndex) -> tuple[int, dict[str, str], list[list[Hit]]]:
    """Count, page hashes, and the top-5 of each query per retrieval leg (lexical, dense)."""
    legs = []
    for q in QUERIES:
        for mode in ("lexical", "dense"):
            cfg = RetrievalSettings(final_k=5, mode=mode)  # type: ignore[arg-type]
            r = await retrieve(
                q, index=index, embedder=BowEmbedder(), sparse=Bm25Encoder(), config=cfg, scope=EVERYTHING
            )
            legs.append(r.hits)
    return await index.count(), await index.page_hashes(), legs


async def _edge_state(index_dir: Path) -> tuple[int, dict[str, str], list[list[Hit]]]:
    index = EdgeIndex(index_dir)
    await index.open(dense_dim=BowEmbedder.dim, embedder=BowEmbedder.name)
    try:
        return await _state(index)
    finally:
        await index.close()


async def _qdrant_state(path: Path, collection: str) -> tuple[int, dict[str, str], list[list[Hit]]]:
    index = QdrantServerIndex(path=path, collection=collection)
    await index.open(dense_dim=BowEmbedder.dim, embedder=BowEmbedder.name)
    try:
        return await _state(index)
    finally:
        await index.close()


def _assert_same(
    a: tuple[int, dict[str, str], list[list[Hit]]], b: tuple[int, dict[str, str], list[list[Hit]]]
) -> None:
    """Same counts and pages; every query ranks alike in each leg (up to ties: Qdrant orders ties
    arbitrarily)."""
    assert a[0] == b[0]
    assert a[1] == b[1]
    assert all(x for x in a[2])
    for x, y in zip(a[2], b[2], strict=True):
        assert same_ranking(x, y), (
            [(h.evidence.id, h.score) for h in x],
            [(h.evidence.id, h.score) for h in y],
        )


def _questions(store_path: Path) -> list[str]:
    con = sqlite3.connect(store_path)
    try:
        return [r[0] for r in con.execute("SELECT question FROM turns ORDER BY id")]
    finally:
        con.close()


async def _add_turn(store_path: Path, question: str) -> None:
    store = Store(store_path)
    try:
        await store.add_turn(TurnRecord(conversation_key="cli:test", question=question, answer="an answer"))
    finally:
        await store.close()


def _fast_dir(fallback: Path) -> Iterator[Path]:
    """A tmpfs directory when there is one: qdrant-client local mode and SQLite fsync on every commit,
    which costs ~20 ms each on a real disk (the migrate tests drop from ~4 s to well under 1 s)."""
    shm = Path("/dev/shm")
    if not (shm.is_dir() and os.access(shm, os.W_OK)):
        yield fallback
        return
    path = Path(tempfile.mkdtemp(prefix="evident-test-", dir=shm))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def work(tmp_path: Path) -> Iterator[Path]:
    yield from _fast_dir(tmp_path)


@pytest.fixture(scope="module")
def built_index(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One sample-space index for the module; tests copy it (Edge writes in place)."""
    for base in _fast_dir(tmp_path_factory.mktemp("built")):
        path = base / "index"
        asyncio.run(_build_index(path))
        yield path


@pytest.fixture
def data_dir(work: Path, built_index: Path) -> Path:
    data = work / "data"
    data.mkdir()
    shutil.copytree(built_index, data / "index", copy_function=copy_sparse)
    return data


def _cli(args: list[str], data_dir: Path) -> Result:
    env = {
        "EVIDENT_DATA_DIR": str(data_dir),
        "EVIDENT_INDEX_DIR": "",
        "EVIDENT_STORE_PATH": "",
        "QDRANT_URL": "",
        "EVIDENT_CONFIG": "",
    }
    return CliRunner().invoke(main, args, env=env, catch_exceptions=False)


# ---------------------------------------------------------------- backup / restore


async def test_backup_restore_round_trip(work: Path, data_dir: Path) -> None:
    store = data_dir / "evident.db"
    await _add_turn(store, "first question")
    before = await _edge_state(data_dir / "index")

    res = await asyncio.to_thread(_cli, ["backup", str(work / "bk")], data_dir)
    assert res.exit_code == 0, res.output
    assert "backup" in res.output and "index" in res.output
    assert (work / "bk" / "manifest.json").is_file()
    assert (work / "bk" / "index" / "manifest.json").is_file()

    # Live data changes after the backup: a new turn, and the index is lost.
    await _add_turn(store, "second question")
    shutil.rmtree(data_dir / "index" / "shard")

    refused = await asyncio.to_thread(_cli, ["restore", str(work / "bk")], data_dir)
    assert refused.exit_code == 2
    assert "refusing to overwrite" in refused.output
    assert _questions(store) == ["first question", "second question"]  # untouched

    res = await asyncio.to_thread(_cli, ["restore", str(work / "bk"), "--force"], data_dir)
    assert res.exit_code == 0, res.output
    assert "restored backup" in res.output
    assert _questions(store) == ["first question"]
    _assert_same(await _edge_state(data_dir / "index"), before)

    # A damaged backup is refused before anything is overwritten (checksums come first).
    (work / "bk" / "evident.db").write_bytes(b"garbage")
    corrupt = await asyncio.to_thread(_cli, ["restore", str(work / "bk"), "--force"], data_dir)
    assert corrupt.exit_code == 2
    assert "corrupt" in corrupt.output
    assert _questions(store) == ["first question"]


def test_backup_refuses_a_non_empty_destination(work: Path, data_dir: Path) -> None:
    asyncio.run(_add_turn(data_dir / "evident.db", "q"))
    (work / "bk").mkdir()
    (work / "bk" / "something").write_text("x")
    res = _cli(["backup", str(work / "bk")], data_dir)
    assert res.exit_code == 2
    assert "not empty" in res.output


# ---------------------------------------------------------------- index migrate


async def test_migrate_preserves_counts_and_top_k(work: Path, data_dir: Path) -> None:
    count, hashes, top = await _edge_state(data_dir / "index")
    assert count == 68  # the sample space
    dest = work / "qdrant"

    res = await asyncio.to_thread(_cli, ["index", "migrate", "--to", f"path:{dest}", "--collection", "moved"],
                                  data_dir)
    assert res.exit_code == 0, res.output
    assert f"{len(hashes)} pages copied ({count} points)" in res.output
    assert f"source {count}, destination {count}" in res.output
    assert "same top-10 for 5/5" in res.output

    _assert_same(await _qdrant_state(dest, "moved"), (count, hashes, top))

    # Resumable / idempotent: a second run copies nothing.
    again = await asyncio.to_thread(
        _cli, ["index", "migrate", "--to", f"path:{dest}", "--collection", "moved"], data_dir
    )
    assert again.exit_code == 0, again.output
    assert f"0 pages copied (0 points), {len(hashes)} unchanged" in again.output


async def test_migrate_takes_the_recipe_with_the_vectors(work: Path, data_dir: Path) -> None:
    """The server collection records how the vectors were made, so it refuses other ones as the source did."""
    manifest_path = data_dir / "index" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    recipe = {"max_tokens": 128, "sparse": "bm25(avg_len=88.0)", "sparse_idf": True}
    manifest_path.write_text(json.dumps({**manifest, "recipe": recipe}))
    dest = work / "qdrant"
    res = await asyncio.to_thread(_cli, ["index", "migrate", "--to", f"path:{dest}"], data_dir)
    assert res.exit_code == 0, res.output
    index = QdrantServerIndex(path=dest, collection="evident")
    with pytest.raises(IndexMismatchError, match="sparse bm25,"):
        await index.open(dense_dim=BowEmbedder.dim, embedder=BowEmbedder.name,
                         recipe={**recipe, "sparse": "bm25"})
    await index.open(dense_dim=BowEmbedder.dim, embedder=BowEmbedder.name, recipe=recipe)
    await index.close()
    other = {**manifest, "recipe": {**recipe, "max_tokens": 64}}
    manifest_path.write_text(json.dumps(other))
    refused = await asyncio.to_thread(_cli, ["index", "migrate", "--to", f"path:{dest}"], data_dir)
    assert refused.exit_code == 2 and "migrate into another --collection or delete that one" in refused.output


async def test_migrate_refuses_extra_destination_pages_without_force(work: Path, data_dir: Path) -> None:
    dest = work / "qdrant"
    index = QdrantServerIndex(path=dest, collection="evident")
    await index.open(dense_dim=BowEmbedder.dim, embedder=BowEmbedder.name)
    ev = Evidence(
        id="stray-1",
        page_id="stray",
        title="Stray",
        url="https://x/stray",
        space="X",
        kind="passage",
        position=0,
        text="stray page",
    )
    vec = tuple(float(x) for x in BowEmbedder().embed_documents(["stray page"])[0])
    await index.replace_page(
        "stray", "h1", [IndexPoint(ev, "stray page", vec, SparseVector((1,), (1.0,)), "h1")]
    )
    await index.close()

    res = await asyncio.to_thread(_cli, ["index", "migrate", "--to", f"path:{dest}"], data_dir)
    assert res.exit_code == 2
    assert "pages that the source lacks" in res.output

    res = await asyncio.to_thread(_cli, ["index", "migrate", "--to", f"path:{dest}", "--force"], data_dir)
    assert res.exit_code == 0, res.output
    assert "1 deleted" in res.output
    count, hashes, _ = await _qdrant_state(dest, "evident")
    assert count == 68 and "stray" not in hashes


def test_migrate_explains_bad_targets_and_missing_index(work: Path) -> None:
    res = _cli(["index", "migrate", "--to", "ftp://nowhere"], work)
    assert res.exit_code == 2
    assert "--to 'ftp://nowhere'" in res.output
    res = _cli(["index", "migrate", "--to", f"path:{work / 'q'}"], work)
    assert res.exit_code == 2
    assert "no embedded index" in res.output


async def test_export_points_round_trips_vectors(data_dir: Path) -> None:
    index = EdgeIndex(data_dir / "index")
    await index.open(dense_dim=BowEmbedder.dim, embedder=BowEmbedder.name)
    try:
        points = [p async for p in index.export_points(batch=7)]
        hashes = await index.page_hashes()
    finally:
        await index.close()
    assert len(points) == 68
    assert len({p.evidence.id for p in points}) == 68
    seen: list[str] = []
    for p in points:  # pages come out contiguously
        if not seen or seen[-1] != p.evidence.page_id:
            assert p.evidence.page_id not in seen
            seen.append(p.evidence.page_id)
        assert p.page_hash == hashes[p.evidence.page_id]
        assert len(p.dense) == BowEmbedder.dim and p.sparse.indices
    # The stored dense vector embeds the dense text production builds (unit vectors kept as given).
    p, opts = points[0], ingest_options()
    dense_text = contextualize(p.evidence, opts.dense_context_items or (), opts.context_item_max_chars)
    expected = BowEmbedder().embed_documents([dense_text])[0]
    assert np.allclose(p.dense, expected, atol=1e-5)
