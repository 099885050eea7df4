"""Query -> ranked evidence: embed, search the hybrid index (fusion inside Qdrant), optionally rerank.

Kept as one small stage so the CLI, the bot and the evaluation all retrieve the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace

from pipeline.access.scope import AccessScope
from pipeline.answer.confidence import Confidence, confidence_of
from pipeline.answer.hub import hub_rerank, rescore
from pipeline.answer.settings import RetrievalSettings
from pipeline.models.vocabulary import KeywordExpander
from pipeline.protocols import Embedder, Index, Reranker, SparseEncoder
from pipeline.types import Hit, SearchRequest, SparseVector


@dataclass
class Retrieval:
    query: str
    hits: list[Hit]
    lexical: list[Hit] = field(default_factory=list)  # filled when traced (the first only, for confidence)
    dense: list[Hit] = field(default_factory=list)
    timings_ms: dict[str, float] = field(default_factory=dict)
    confidence: Confidence | None = None
    # (query word, corpus word, cosine)
    expansions: list[tuple[str, str, float]] = field(default_factory=list)
    firsts: list[Hit] = field(default_factory=list)  # each ranker's first evidence (hybrid search)


def _search_request(
    dense_vec: tuple[float, ...] | None,
    sparse_vec: SparseVector,
    *,
    config: RetrievalSettings,
    scope: AccessScope,
    reranking: bool,
    context_pages: bool,
) -> SearchRequest:
    """The index request: the candidate pool is larger where candidates are reranked or rescored."""
    limit = max(config.final_k, config.rerank_pool) if reranking else config.final_k
    if config.hub_weight or (config.continuity_boost and context_pages):
        limit = max(limit, config.rescore_pool)
    return SearchRequest(
        dense=dense_vec,
        sparse=sparse_vec,
        scope=scope,
        mode=config.mode,
        lexical_k=max(config.lexical_k, limit if config.mode == "lexical" else 0),
        dense_k=max(config.dense_k, limit if config.mode == "dense" else 0),
        limit=limit,
        rrf_k=config.rrf_k,
        fusion=config.fusion,
    )


async def retrieve(
    query: str,
    *,
    scope: AccessScope,
    index: Index,
    embedder: Embedder,
    sparse: SparseEncoder,
    config: RetrievalSettings,
    reranker: Reranker | None = None,
    trace: bool = False,
    context_pages: Sequence[str] = (),
    expander: KeywordExpander | None = None,
) -> Retrieval:
    """Retrieve ``config.final_k`` hits for ``query`` that ``scope`` may see (its spaces, its readers)."""
    timings: dict[str, float] = {}
    with _timer(timings, "embed_query"):
        dense_vec = await _dense(query, embedder) if config.mode != "lexical" or trace else None
        sparse_vec = sparse.encode_query(query)
    expansions: list[tuple[str, str, float]] = []
    if expander is not None and config.keyword_weight > 0 and config.mode != "dense":
        with _timer(timings, "expand"):
            sparse_vec, expansions = await asyncio.to_thread(
                expander.expand, query, sparse_vec, weight=config.keyword_weight,
                min_similarity=config.keyword_min_similarity)
    request = _search_request(dense_vec, sparse_vec, config=config, scope=scope,
                              reranking=reranker is not None, context_pages=bool(context_pages))
    # each ranker's first, with the search: for the confidence check, and to keep it among the evidence
    legs = trace or (config.mode == "hybrid" and (config.confidence or config.keep_firsts))
    with _timer(timings, "search"):  # with each ranker alone when needed: one operation, one round trip
        found = await index.search_many([request, *_leg_requests(request, config, trace=trace)]) if legs \
            else [await index.search(request)]
        hits = await _rescored(found[0], config, sparse, context_pages)
    result = Retrieval(query=query, hits=hits, timings_ms=timings, expansions=expansions)
    if legs and (trace or hits):
        with _timer(timings, "confidence"):  # the rankers' lists came with the search
            _set_legs(result, found[1], found[2], config, trace)
    if reranker is not None and hits:
        with _timer(timings, "rerank"):
            hits = await asyncio.to_thread(reranker.rerank, query, hits)
    result.hits = hits[: config.final_k]
    if config.adaptive_min_k:
        result.hits = steepest_cut(result.hits, config.adaptive_min_k)
    if legs and config.mode == "hybrid":
        result.firsts = [leg[0] for leg in found[1:3] if leg]
        if config.keep_firsts and reranker is None and result.hits:  # a reranker reads every candidate
            # within an adaptive cut, a first replaces; it never lengthens the list the cut shortened
            room = len(result.hits) if config.adaptive_min_k else config.final_k
            result.hits = keep_firsts(result.hits, result.firsts, room)
    return result


def keep_firsts(hits: list[Hit], firsts: Sequence[Hit], k: int) -> list[Hit]:
    """``hits`` (fused, at most ``k``) with each ranker's first evidence among them: one fusion ranked lower
    takes the last place (appended while fewer than ``k``), at the score of the hit before that place;
    the fused first is never replaced (the confidence check is of it), nor another ranker's first.

    Why: distribution-based fusion maps each ranker's scores by their own spread, so a keyword search with a
    single match (an identifier, an error code, a code word that one passage holds) scores that match 0.5,
    as an average meaning match, and ten meaning matches above the mean pushed it out of the evidence."""
    out = list(hits)
    kept = {f.evidence.id for f in firsts}
    for first in firsts:
        if any(h.evidence.id == first.evidence.id for h in out):
            continue
        if len(out) >= k:
            spare = [i for i, h in enumerate(out) if i > 0 and h.evidence.id not in kept]
            if not spare:
                continue
            out.pop(spare[-1])
        score = out[-1].score if out else first.score
        out.append(replace(first, score=score, rank=len(out) + 1))
    return [replace(h, rank=i) for i, h in enumerate(out, start=1)]


async def retrieve_fused(
    queries: Sequence[str],
    *,
    scope: AccessScope,
    index: Index,
    embedder: Embedder,
    sparse: SparseEncoder,
    config: RetrievalSettings,
    reranker: Reranker | None = None,
    trace: bool = False,
    context_pages: Sequence[str] = (),
    expander: KeywordExpander | None = None,
) -> Retrieval:
    """Retrieve with each distinct query (concurrently) and fuse the lists by weighted reciprocal rank:
    evidence at rank r of the first list gains 1 / (``rrf_k`` + r), of a later list
    ``config.fused_query_weight`` / (``rrf_k`` + r). One query is a plain :func:`retrieve`. The fused
    retrieval keeps the first query's confidence and traced legs; its ``query`` names all of them."""
    distinct = list(dict.fromkeys(q for q in queries if q.strip())) or [""]
    results = await asyncio.gather(*(
        retrieve(q, scope=scope, index=index, embedder=embedder, sparse=sparse, config=config,
                 reranker=reranker, trace=trace, context_pages=context_pages, expander=expander)
        for q in distinct
    ))
    if len(results) == 1:
        return results[0]
    first = results[0]
    timings: dict[str, float] = {}
    for r in results:
        for name, ms in r.timings_ms.items():
            timings[name] = timings.get(name, 0.0) + ms
    weights = [1.0] + [config.fused_query_weight] * (len(results) - 1)
    fused = fuse_ranks([r.hits for r in results], config.rrf_k, weights)[: config.final_k]
    firsts = [f for r, w in zip(results, weights, strict=True) if w > 0 for f in r.firsts]
    if config.keep_firsts and reranker is None and fused:  # within adaptive cuts, as ``retrieve`` keeps them
        fused = keep_firsts(fused, firsts, len(fused) if config.adaptive_min_k else config.final_k)
    return replace(first, query=" | ".join(distinct), hits=fused, timings_ms=timings, firsts=firsts)


def fuse_ranks(lists: Sequence[Sequence[Hit]], rrf_k: int,
               weights: Sequence[float] | None = None) -> list[Hit]:
    """Weighted reciprocal-rank fusion by evidence id (ties: the earlier list's order)."""
    scores: dict[str, float] = {}
    first_seen: dict[str, Hit] = {}
    for i, hits in enumerate(lists):
        weight = weights[i] if weights is not None else 1.0
        for rank, hit in enumerate(hits, start=1):
            eid = hit.evidence.id
            scores[eid] = scores.get(eid, 0.0) + weight / (rrf_k + rank)
            first_seen.setdefault(eid, hit)
    order = sorted(first_seen, key=lambda eid: -scores[eid])  # stable: first-seen order breaks ties
    return [replace(first_seen[eid], score=scores[eid], rank=i) for i, eid in enumerate(order, start=1)]


async def _dense(query: str, embedder: Embedder) -> tuple[float, ...]:
    out = await asyncio.to_thread(embedder.embed_queries, [query])
    return tuple(float(x) for x in out[0])


async def _rescored(hits: list[Hit], config: RetrievalSettings, sparse: SparseEncoder,
                    context_pages: Sequence[str]) -> list[Hit]:
    """Continuity (the previous turn's pages) and graph reranking, where configured."""
    if config.continuity_boost and context_pages and hits:
        hits = boost_pages(hits, set(context_pages), config.continuity_boost)
    if config.hub_weight and hits:
        hits = await asyncio.to_thread(hub_rerank, hits, sparse, config.hub_weight)
    return hits


def _leg_requests(request: SearchRequest, config: RetrievalSettings, *, trace: bool) -> list[SearchRequest]:
    """Each ranker alone: its top hit for the confidence check, its whole list when traced."""
    return [replace(request, mode="lexical", limit=config.lexical_k if trace else 1),
            replace(request, mode="dense", limit=config.dense_k if trace else 1)]


def _set_legs(result: Retrieval, lexical: list[Hit], dense: list[Hit], config: RetrievalSettings,
              trace: bool) -> None:
    result.lexical, result.dense = lexical, dense
    if config.mode == "hybrid" and (config.confidence or trace):
        result.confidence = confidence_of(result.hits, next(iter(lexical), None), next(iter(dense), None))


@contextlib.contextmanager
def _timer(timings: dict[str, float], name: str) -> Iterator[None]:
    t = time.perf_counter()
    try:
        yield
    finally:
        timings[name] = timings.get(name, 0.0) + (time.perf_counter() - t) * 1000


def steepest_cut(hits: list[Hit], min_k: int) -> list[Hit]:
    """The hits before the largest score drop between neighbours, keeping at least ``min_k`` (ties: the
    earlier drop): adaptive k from the score curve instead of a fixed cut."""
    if len(hits) <= min_k:
        return hits
    _, cut = max((hits[i - 1].score - hits[i].score, -i) for i in range(min_k, len(hits)))
    return hits[:-cut]


def boost_pages(hits: list[Hit], pages: set[str], boost: float) -> list[Hit]:
    """Multiply the scores of hits on ``pages`` by (1 + boost) and re-rank."""
    return rescore(hits, [h.score * (1.0 + boost) if h.evidence.page_id in pages else h.score for h in hits])
