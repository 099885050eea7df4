"""``openai:<model>`` against a local server speaking the OpenAI embeddings wire format."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import numpy as np
import pytest
from fake_embeddings import FakeEmbeddingsServer

from connectors.local import sample_space_dir
from pipeline.errors import AuthError, EmbeddingError, NotFoundError, RateLimitedError, UnreachableError
from pipeline.models.embedders import make_embedder
from pipeline.models.openai_embedder import OpenAIEmbedder, RemoteEmbedding


def embedder(server: FakeEmbeddingsServer, **kw: object) -> OpenAIEmbedder:
    params: dict[str, object] = {"base_url": server.base_url, "batch_size": 8, "max_retries": 3,
                                 "backoff_max_s": 0.2}
    params.update(kw)
    return OpenAIEmbedder("fake-embed", **params)  # type: ignore[arg-type]


def test_vectors_batches_order_and_prefixes() -> None:
    with FakeEmbeddingsServer(dim=48, latency_s=0.02) as server:
        emb = embedder(server, query_prefix="query: ", document_prefix="passage: ", concurrency=4)
        assert emb.dim == 48 and emb.name == "openai:fake-embed[dim=48,q='query: ',d='passage: ']"
        texts = [f"text number {i}" for i in range(30)]
        docs = emb.embed_documents(texts)
        assert docs.shape == (30, 48) and docs.dtype == np.float32
        expected = np.vstack([FakeEmbeddingsServer.vector("passage: " + t, 48) for t in texts])
        # right rows in the right order, though answered reversed
        assert np.allclose(docs, expected, atol=1e-5)
        query = emb.embed_queries(["who"])
        assert np.allclose(query[0], FakeEmbeddingsServer.vector("query: who", 48), atol=1e-5)
        sizes = [len(r["input"]) for r in server.requests[1:]]
        assert max(sizes) <= 8 and sum(sizes) == 31  # probe aside, batches of at most batch_size
        assert server.max_in_flight > 1  # requests overlap
        emb.close()


def test_request_token_budget_splits_long_inputs() -> None:
    with FakeEmbeddingsServer() as server:
        emb = embedder(server, batch_size=100, max_tokens=100, max_request_tokens=120)
        emb.embed_documents(["word " * 200] * 6)  # each cut to ~100 tokens: one per request
        emb.close()
        assert [len(r["input"]) for r in server.requests[1:]] == [1] * 6
        assert all(len(t) <= 300 for r in server.requests[1:] for t in r["input"])


def test_429_with_retry_after_is_retried() -> None:
    with FakeEmbeddingsServer() as server:
        emb = embedder(server)
        server.fail_next(429, 2, retry_after=0.05)
        server.fail_next(503, 1)
        start = time.perf_counter()
        out = emb.embed_documents(["a", "b"])
        assert out.shape == (2, 64) and time.perf_counter() - start >= 0.1  # both Retry-After waits honoured
        server.fail_next(429, 10, retry_after=0.01)
        with pytest.raises(RateLimitedError) as info:
            emb.embed_documents(["c"])
        assert info.value.retry_after_s == 0.01
        emb.close()


def test_batch_too_large_for_the_server_is_halved() -> None:
    with FakeEmbeddingsServer(max_inputs=3) as server:
        emb = embedder(server, batch_size=8)
        out = emb.embed_documents([f"t{i}" for i in range(8)])
        assert out.shape == (8, 64)
        assert max(len(r["input"]) for r in server.requests[1:] if r) <= 8
        assert np.allclose(out[5], FakeEmbeddingsServer.vector("t5", 64), atol=1e-5)
        emb.close()


def test_startup_errors_name_the_setting() -> None:
    with FakeEmbeddingsServer(require_key="right") as server:
        with pytest.raises(AuthError, match="EVIDENT_EMBED_API_KEY"):
            embedder(server, api_key="wrong")
        ok = embedder(server, api_key="right")
        assert ok.dim == 64 and server.headers[-1]["Authorization"] == "Bearer right"
        ok.close()
        with pytest.raises(NotFoundError, match="'nope' is unknown at EVIDENT_EMBED_BASE_URL"):
            OpenAIEmbedder("nope", base_url=server.base_url, api_key="right")
        small = embedder(server, api_key="right", dimensions=32)
        assert small.dim == 32  # text-embedding-3 style
        small.close()
    with FakeEmbeddingsServer(honour_dimensions=False) as server:
        with pytest.raises(EmbeddingError, match="EVIDENT_EMBED_DIMENSIONS asks for 32"):
            embedder(server, dimensions=32)
        emb = embedder(server)
        server.dim = 96  # the model behind the name changed
        with pytest.raises(EmbeddingError, match="96-dim vectors; this index uses 64"):
            emb.embed_documents(["x"])
        emb.close()
    with pytest.raises(UnreachableError, match="EVIDENT_EMBED_BASE_URL"):
        OpenAIEmbedder("fake-embed", base_url="http://127.0.0.1:9/v1", max_retries=0)
    with pytest.raises(EmbeddingError, match="EVIDENT_EMBED_BASE_URL"):
        make_embedder("openai:fake-embed", remote=RemoteEmbedding(base_url=""))


def test_azure_style_key_and_api_version() -> None:
    with FakeEmbeddingsServer(require_key="azkey") as server:
        emb = embedder(server, api_key="azkey", api_version="2024-02-01")
        assert server.headers[-1].get("api-key") == "azkey" and "Authorization" not in server.headers[-1]
        emb.embed_documents(["x"])
        emb.close()


async def test_ingest_through_a_remote_embedder(tmp_path: Path) -> None:
    from helpers import ingest_folder

    with FakeEmbeddingsServer(latency_s=0.01) as server:
        emb = make_embedder("openai:fake-embed", batch_size=16,
                            remote=RemoteEmbedding(base_url=server.base_url, concurrency=4))
        index, _, report = await ingest_folder(tmp_path / "index", sample_space_dir(), embedder=emb)
        assert report.ok and report.evidence > 50
        stats = await index.stats()
        assert stats["embedder"] == emb.name and stats["dim"] == 64
        await index.close()
        await asyncio.to_thread(emb.close)  # type: ignore[attr-defined]
