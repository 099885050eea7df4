"""Query -> ranked evidence: embed, search the hybrid index (fusion inside Qdrant), optionally rerank.

Kept as one small stage so the CLI, the bot and the evaluation all retrieve the same way.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from pipeline.answer.confidence import Confidence, confidence_of
from pipeline.answer.hub import hub_rerank, rescore
from pipeline.models.vocabulary import KeywordExpander
from pipeline.protocols import Embedder, Index, Reranker, SparseEncoder
from pipeline.types import Hit, RetrievalMode, SearchRequest, SparseVector


@dataclass(frozen=True)
class RetrievalConfig:
    mode: RetrievalMode = "hybrid"
    lexical_k: int = 10
    dense_k: int = 10
    final_k: int = 10
    rrf_k: int = 60
    weights: tuple[float, float] | None = None  # (lexical, dense) weighted RRF
    fusion: Literal["rrf", "dbsf"] = "rrf"  # rank fusion or score pooling (``SearchRequest.fusion``)
    # Graph reranking: each hit gains ``hub_weight`` x its mean lexical similarity to the other retrieved
    # evidence (``pipeline.answer.hub``), over the top ``aggregation_pool``.
    hub_weight: float = 0.0
    # Adaptive k: cut the final hits at the steepest score drop, keeping at least this many (0 = fixed final_k).
    adaptive_min_k: int = 0
    rerank_pool: int = 20  # fused candidates handed to the reranker
    # Page-level score aggregation: each hit gains ``page_aggregation`` x the fused score of the other
    # evidence of its page within the top ``aggregation_pool``. Precision@1 is page-level, and a page
    # with several matching pieces is likelier the right one than a page with one lucky match.
    page_aggregation: float = 0.0
    aggregation_pool: int = 30
    # Fusion weights (lexical, dense) for queries that are not in the corpus language: lexical matching
    # across languages only hits shared names, so the multilingual dense side should count more.
    foreign_weights: tuple[float, float] | None = None
    corpus_language: str = "english"
    # Dense pseudo-relevance feedback: add the top ``prf_terms`` terms of the ``prf_docs`` best dense hits
    # to the lexical query (weight ``prf_weight``). Across languages the dense side finds the right
    # English evidence while the German words match nothing lexically; feedback gives lexical search
    # the corpus-language words. ``prf_foreign_only`` applies it only to non-corpus-language queries.
    prf_docs: int = 0
    prf_terms: int = 10
    prf_weight: float = 0.5
    prf_foreign_only: bool = True
    # Conversational continuity: for follow-ups, evidence from the pages the previous turn retrieved gets
    # its fused score multiplied by (1 + continuity_boost). Threads mostly stay on one page.
    continuity_boost: float = 0.0
    # Confidence (``pipeline.answer.confidence``): one extra top-1 search per ranker (hybrid mode only).
    confidence: bool = True
    # Keyword expansion (``pipeline.models.vocabulary``): each query word the corpus never uses adds its nearest
    # corpus word (cosine >= keyword_min_similarity) to the lexical query at this weight; 0 = off.
    keyword_weight: float = 0.0
    keyword_min_similarity: float = 0.85


@dataclass
class Retrieval:
    query: str
    hits: list[Hit]
    lexical: list[Hit] = field(default_factory=list)  # filled when traced (the first only, for confidence)
    dense: list[Hit] = field(default_factory=list)
    timings_ms: dict[str, float] = field(default_factory=dict)
    confidence: Confidence | None = None
    expansions: list[tuple[str, str, float]] = field(default_factory=list)  # (query word, corpus word, cosine)


async def _search_request(
    query: str, dense_vec: tuple[float, ...] | None, sparse_vec: SparseVector, *, index: Index,
    sparse: SparseEncoder, config: RetrievalConfig, spaces: tuple[str, ...] | None, reranking: bool,
    context_pages: bool, timings: dict[str, float],
) -> SearchRequest:
    """The index request: candidate pool size, RRF weights for the query's language, and the sparse
    query expanded by pseudo-relevance feedback where configured."""
    limit = max(config.final_k, config.rerank_pool) if reranking else config.final_k
    if config.page_aggregation or config.hub_weight or (config.continuity_boost and context_pages):
        limit = max(limit, config.aggregation_pool)
    # The language guess only matters to the two options that depend on it.
    needs_lang = config.foreign_weights is not None or (config.prf_docs and config.prf_foreign_only)
    foreign = bool(needs_lang) and query_language(query) != config.corpus_language
    weights = config.weights
    if config.foreign_weights is not None and foreign:
        weights = config.foreign_weights
    if config.prf_docs and dense_vec is not None and config.mode == "hybrid" and (foreign or not config.prf_foreign_only):
        t = time.perf_counter()
        seeds = await index.search(SearchRequest(dense=dense_vec, sparse=None, mode="dense",
                                                 dense_k=config.prf_docs, limit=config.prf_docs, spaces=spaces))
        sparse_vec = expand_sparse(sparse_vec, sparse, [h.content or h.evidence.text for h in seeds],
                                   n_terms=config.prf_terms, weight=config.prf_weight)
        timings["prf"] = (time.perf_counter() - t) * 1000
    request = SearchRequest(
        dense=dense_vec,
        sparse=sparse_vec,
        mode=config.mode,
        lexical_k=max(config.lexical_k, limit if config.mode == "lexical" else 0),
        dense_k=max(config.dense_k, limit if config.mode == "dense" else 0),
        limit=limit,
        spaces=spaces,
        rrf_k=config.rrf_k,
        weights=weights,
        fusion=config.fusion,
    )
    return request


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
    context_pages: Sequence[str] = (),
    expander: KeywordExpander | None = None,
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
    expansions: list[tuple[str, str, float]] = []
    if expander is not None and config.keyword_weight > 0 and config.mode != "dense":
        t = time.perf_counter()
        sparse_vec, expansions = await asyncio.to_thread(
            expander.expand, query, sparse_vec, weight=config.keyword_weight,
            min_similarity=config.keyword_min_similarity)
        timings["expand"] = (time.perf_counter() - t) * 1000

    request = await _search_request(query, dense_vec, sparse_vec, index=index, sparse=sparse, config=config,
                                    spaces=spaces, reranking=reranker is not None,
                                    context_pages=bool(context_pages), timings=timings)
    t = time.perf_counter()
    hits = await index.search(request)
    timings["search"] = (time.perf_counter() - t) * 1000
    if config.page_aggregation and hits:
        hits = aggregate_pages(hits, config.page_aggregation)
    if config.continuity_boost and context_pages and hits:
        hits = boost_pages(hits, set(context_pages), config.continuity_boost)
    if config.hub_weight and hits:
        hits = await asyncio.to_thread(hub_rerank, hits, sparse, config.hub_weight)
    result = Retrieval(query=query, hits=hits, timings_ms=timings, expansions=expansions)
    if trace or (config.confidence and config.mode == "hybrid" and hits):
        t = time.perf_counter()
        result.lexical, result.dense = await asyncio.gather(
            index.search(replace(request, mode="lexical", limit=config.lexical_k if trace else 1)),
            index.search(replace(request, mode="dense", limit=config.dense_k if trace else 1)))
        if config.mode == "hybrid":
            result.confidence = confidence_of(hits, next(iter(result.lexical), None), next(iter(result.dense), None))
        timings["confidence"] = (time.perf_counter() - t) * 1000
    if reranker is not None and hits:
        t = time.perf_counter()
        hits = await asyncio.to_thread(reranker.rerank, query, hits)
        timings["rerank"] = (time.perf_counter() - t) * 1000
    result.hits = hits[: config.final_k]
    if config.adaptive_min_k:
        result.hits = steepest_cut(result.hits, config.adaptive_min_k)
    return result


def steepest_cut(hits: list[Hit], min_k: int) -> list[Hit]:
    """The hits before the largest score drop between neighbours, keeping at least ``min_k`` (ties: the earlier
    drop): adaptive k from the score curve instead of a fixed cut."""
    if len(hits) <= min_k:
        return hits
    _, cut = max((hits[i - 1].score - hits[i].score, -i) for i in range(min_k, len(hits)))
    return hits[:-cut]


def aggregate_pages(hits: list[Hit], weight: float) -> list[Hit]:
    """Rescore each hit by its own score plus ``weight`` x the scores of its page's other hits."""
    page_total: dict[str, float] = {}
    for h in hits:
        page_total[h.evidence.page_id] = page_total.get(h.evidence.page_id, 0.0) + h.score
    return rescore(hits, [h.score + weight * (page_total[h.evidence.page_id] - h.score) for h in hits])


def query_language(text: str) -> str:
    """Cheap stopword-based language guess (english/german), used to pick fusion weights."""
    from pipeline.models.sparse import STOPWORDS, tokenize

    tokens = tokenize(text)
    best, best_count = "english", 0
    for lang in ("english", "german"):
        stop = STOPWORDS.get(lang, frozenset())
        count = sum(1 for t in tokens if t in stop)
        if count > best_count:
            best, best_count = lang, count
    return best


def boost_pages(hits: list[Hit], pages: set[str], boost: float) -> list[Hit]:
    """Multiply the scores of hits on ``pages`` by (1 + boost) and re-rank."""
    return rescore(hits, [h.score * (1.0 + boost) if h.evidence.page_id in pages else h.score for h in hits])


def expand_sparse(
    query: SparseVector, encoder: SparseEncoder, feedback: Sequence[str], *, n_terms: int, weight: float
) -> SparseVector:
    """Add the heaviest terms of the feedback texts to a sparse query (existing terms keep their weight)."""
    totals: dict[int, float] = {}
    for vec in encoder.encode_documents(list(feedback)):
        for i, v in zip(vec.indices, vec.values, strict=True):
            totals[i] = totals.get(i, 0.0) + v
    merged = dict(zip(query.indices, query.values, strict=True))
    for i, _ in sorted(totals.items(), key=lambda kv: kv[1], reverse=True)[:n_terms]:
        merged.setdefault(i, weight)
    ordered = sorted(merged.items())
    return SparseVector(tuple(i for i, _ in ordered), tuple(v for _, v in ordered))
