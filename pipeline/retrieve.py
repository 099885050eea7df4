"""Query -> ranked evidence: embed, search the hybrid index (fusion inside Qdrant), optionally rerank.

Kept as one small stage so the CLI, the bot and the evaluation all retrieve the same way.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field, replace

from pipeline.protocols import Embedder, Index, Reranker, SparseEncoder
from pipeline.types import Hit, RetrievalMode, SearchRequest


@dataclass(frozen=True)
class RetrievalConfig:
    mode: RetrievalMode = "hybrid"
    lexical_k: int = 10
    dense_k: int = 10
    final_k: int = 10
    rrf_k: int = 60
    weights: tuple[float, float] | None = None  # (lexical, dense) weighted RRF
    rerank_pool: int = 20  # fused candidates handed to the reranker


@dataclass
class Retrieval:
    query: str
    hits: list[Hit]
    lexical: list[Hit] = field(default_factory=list)  # filled when traced
    dense: list[Hit] = field(default_factory=list)
    timings_ms: dict[str, float] = field(default_factory=dict)


async def embed_query(embedder: Embedder, sparse: SparseEncoder, query: str) -> tuple[tuple[float, ...], object]:
    vec = await asyncio.to_thread(embedder.embed_queries, [query])
    return tuple(float(x) for x in vec[0]), sparse.encode_query(query)


async def retrieve(
    query: str,
    *,
    index: Index,
    embedder: Embedder,
    sparse: SparseEncoder,
    config: RetrievalConfig,
    reranker: Reranker | None = None,
    spaces: tuple[str, ...] | None = None,
    trace: bool = False,
) -> Retrieval:
    """Retrieve ``config.final_k`` hits for ``query`` within ``spaces`` (None = every space)."""
    timings: dict[str, float] = {}
    t = time.perf_counter()
    need_dense = config.mode != "lexical" or trace
    dense_vec = None
    if need_dense:
        out = await asyncio.to_thread(embedder.embed_queries, [query])
        dense_vec = tuple(float(x) for x in out[0])
    sparse_vec = sparse.encode_query(query)
    timings["embed_query"] = (time.perf_counter() - t) * 1000

    limit = max(config.final_k, config.rerank_pool) if reranker else config.final_k
    request = SearchRequest(
        dense=dense_vec,
        sparse=sparse_vec,
        mode=config.mode,
        lexical_k=max(config.lexical_k, limit if config.mode == "lexical" else 0),
        dense_k=max(config.dense_k, limit if config.mode == "dense" else 0),
        limit=limit,
        spaces=spaces,
        rrf_k=config.rrf_k,
        weights=config.weights,
    )
    t = time.perf_counter()
    hits = await index.search(request)
    timings["search"] = (time.perf_counter() - t) * 1000
    result = Retrieval(query=query, hits=hits, timings_ms=timings)
    if trace:
        result.lexical = await index.search(replace(request, mode="lexical", limit=config.lexical_k))
        result.dense = await index.search(replace(request, mode="dense", limit=config.dense_k))
    if reranker is not None and hits:
        t = time.perf_counter()
        hits = await asyncio.to_thread(reranker.rerank, query, hits)
        timings["rerank"] = (time.perf_counter() - t) * 1000
    result.hits = hits[: config.final_k]
    return result
