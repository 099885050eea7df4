"""`evident eval retrieval`: Precision@1, hit@k, MRR over ConfQuestions-shaped conversations.

The conversational query type uses only what a deployed system would have: the current question,
earlier questions and the system's own earlier retrieval results — never gold answers or URLs. With an LLM
configured, ``llm`` retrieves with the LLM-completed question (the rephrase prompt over the earlier questions)
and ``fused`` with it and the conversational query, fused by rank (``EVIDENT_FOLLOWUP_RETRIEVAL``).
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pipeline.access.scope import EVERYTHING
from pipeline.answer.completion import complete_question
from pipeline.answer.prompts import PromptLibrary
from pipeline.answer.query_builder import PriorTurn, QueryPlan, build_query, context_pages
from pipeline.answer.retrieve import Retrieval, retrieve_fused
from pipeline.answer.settings import RetrievalSettings
from pipeline.errors import ConfigError
from pipeline.evaluation.copies import page_copies, with_copies
from pipeline.evaluation.data import QATurn
from pipeline.evaluation.index_cache import PageSource
from pipeline.evaluation.metrics import (
    first_hit_rank,
    hit_at,
    ndcg_at,
    p_at_1,
    percentile,
    rr_at,
    turn_bucket,
)
from pipeline.models.vocabulary import KeywordExpander
from pipeline.protocols import LLM, Embedder, Index, Reranker, SparseEncoder
from pipeline.settings import PipelineSettings

QUERY_TYPES = ("completed", "conversational", "raw")
LLM_QUERY_TYPES = ("llm", "fused")  # need an LLM endpoint
Complete = Callable[[str, Sequence[PriorTurn]], Awaitable[str | None]]


@dataclass
class QuestionResult:
    query_type: str
    lang: str
    conv_id: str
    turn: int
    source: str
    q_type: str
    query: str
    rank: int | None
    latency_ms: float
    top_urls: list[str] = field(default_factory=list)
    copy_rank: int | None = None  # rank of the first gold page or near-copy of it (``evaluation.copies``)


def _row(results: Sequence[QuestionResult], **keys: object) -> dict[str, Any]:
    n = len(results)
    ranks = [r.rank for r in results]
    lat = [r.latency_ms for r in results]

    def mean(xs: list[float]) -> float:
        return round(sum(xs) / n, 4) if n else 0.0

    return {
        **keys,
        "n": n,
        "p_at_1": mean([p_at_1(x) for x in ranks]),
        "p_at_1_copies": mean([p_at_1(r.copy_rank) for r in results]),
        "hit_at_5": mean([hit_at(x, 5) for x in ranks]),
        "hit_at_10": mean([hit_at(x, 10) for x in ranks]),
        "mrr_at_10": mean([rr_at(x, 10) for x in ranks]),
        "ndcg_at_10": mean([ndcg_at(x, 10) for x in ranks]),
        "latency_ms_p50": round(percentile(lat, 50), 2),
        "latency_ms_p95": round(percentile(lat, 95), 2),
    }


async def run_retrieval_eval(
    conversations: Sequence[Sequence[QATurn]],
    *,
    index: Index,
    embedder: Embedder,
    sparse: SparseEncoder,
    config: RetrievalSettings,
    reranker: Reranker | None = None,
    langs: Sequence[str] = ("en", "de"),
    query_types: Sequence[str] = ("completed", "conversational"),
    strategy: str,
    strict_urls: bool = False,
    expander: KeywordExpander | None = None,
    copies: dict[str, frozenset[str]] | None = None,
    complete: Complete | None = None,
) -> list[QuestionResult]:
    """Every question of ``conversations`` in each language and query type. ``copies`` (page URL ->
    near-copies, ``evaluation.copies.page_copies``) adds the copy-aware rank; without it that rank is the
    page-id rank. ``complete`` (the LLM's question completion) is needed by the ``llm`` and ``fused`` types;
    each turn is completed once for both."""
    async def search(queries: Sequence[str], pages: Sequence[str]) -> Retrieval:
        return await retrieve_fused(
            queries,
            scope=EVERYTHING,
            index=index,
            embedder=embedder,
            sparse=sparse,
            config=config,
            reranker=reranker,
            context_pages=pages,
            expander=expander,
        )

    if complete is None and any(qt in LLM_QUERY_TYPES for qt in query_types):
        raise ConfigError("the llm and fused query types need an LLM endpoint (EVIDENT_LLM_BASE_URL)")
    completions: dict[tuple[str, str, int], str | None] = {}

    async def completed(turn: QATurn, lang: str, prior: Sequence[PriorTurn]) -> str | None:
        key = (lang, turn.conv_id, turn.turn)
        if key not in completions:
            assert complete is not None
            completions[key] = await complete(turn.q[lang], prior) if prior else None
        return completions[key]

    out: list[QuestionResult] = []
    for qt in query_types:
        for lang in langs:
            for conv in conversations:
                out += await _conversation(conv, qt, lang, search, strategy, strict_urls, copies, completed)
    return out


async def _queries(turn: QATurn, qt: str, lang: str, prior: Sequence[PriorTurn], strategy: str,
                   completed: Callable[[QATurn, str, Sequence[PriorTurn]], Awaitable[str | None]],
                   ) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(queries, context pages) for one turn and query type."""
    if qt == "completed":
        return (turn.completed[lang],), ()
    if qt == "raw":
        return (turn.q[lang],), ()
    builder = build_query(turn.q[lang], prior, strategy=strategy)
    pages = context_pages(turn.q[lang], prior)
    if qt == "conversational":
        return (builder,), pages
    llm = await completed(turn, lang, prior)
    plan = QueryPlan(question=turn.q[lang], completed=llm or turn.q[lang], retrieval_query=llm or builder,
                     followup=bool(prior), context_pages=pages, builder_query=builder)
    return plan.retrieval_queries("fused" if qt == "fused" else "completed"), pages


async def _conversation(conv: Sequence[QATurn], qt: str, lang: str,
                        search: Callable[[Sequence[str], Sequence[str]], Awaitable[Retrieval]], strategy: str,
                        strict_urls: bool, copies: dict[str, frozenset[str]] | None,
                        completed: Callable[[QATurn, str, Sequence[PriorTurn]], Awaitable[str | None]],
                        ) -> list[QuestionResult]:
    """One conversation's turns in order, each retrieved with the query of type ``qt``."""
    out: list[QuestionResult] = []
    prior: list[PriorTurn] = []
    for turn in conv:
        if lang not in turn.q:
            continue
        queries, pages = await _queries(turn, qt, lang, prior, strategy, completed)
        query = " | ".join(queries)
        t = time.perf_counter()
        r = await search(queries, pages)
        latency = (time.perf_counter() - t) * 1000
        urls = [h.evidence.url for h in r.hits]
        rank = first_hit_rank(urls, turn.gold_urls, strict=strict_urls)
        copy_rank = first_hit_rank(urls, with_copies(turn.gold_urls, copies)) if copies else rank
        out.append(QuestionResult(qt, lang, turn.conv_id, turn.turn, turn.source, turn.q_type, query, rank,
                                  latency, urls[:3], copy_rank))
        prior.append(
            PriorTurn(
                question=turn.q[lang],
                retrieved_titles=tuple(h.evidence.title for h in r.hits[:3]),
                retrieved_pages=tuple(h.evidence.page_id for h in r.hits[:3]),
            )
        )
    return out


def summarize(
    results: Sequence[QuestionResult], *, by: Sequence[str] = (), config: dict[str, object] | None = None
) -> dict[str, Any]:
    """The report JSON: ``{"config": ..., "rows": [...]}`` plus optional breakdowns and averages."""
    groups: dict[tuple[str, str], list[QuestionResult]] = defaultdict(list)
    for r in results:
        groups[(r.query_type, r.lang)].append(r)
    rows = [_row(rs, query=q, lang=lang) for (q, lang), rs in groups.items()]
    report: dict[str, Any] = {"config": config or {}, "rows": rows}
    averages = []
    for q in dict.fromkeys(r.query_type for r in results):
        qrows = [row for row in rows if row["query"] == q]
        if len(qrows) > 1:
            averages.append(
                {
                    "query": q,
                    "lang": "avg",
                    "p_at_1": round(sum(float(r["p_at_1"]) for r in qrows) / len(qrows), 4),
                    "mrr_at_10": round(sum(float(r["mrr_at_10"]) for r in qrows) / len(qrows), 4),
                    "p_at_1_copies": round(sum(float(r["p_at_1_copies"]) for r in qrows) / len(qrows), 4),
                }
            )
    if averages:
        report["averages"] = averages
    breakdowns: dict[str, list[dict[str, object]]] = {}
    for dim in by:
        key_of = {
            "source": lambda r: r.source,
            "type": lambda r: r.q_type,
            "turn": lambda r: turn_bucket(r.turn),
        }[dim]
        sub: dict[tuple[str, str, str], list[QuestionResult]] = defaultdict(list)
        for r in results:
            sub[(r.query_type, r.lang, key_of(r))].append(r)
        breakdowns[dim] = [_row(rs, query=q, lang=lang, group=g) for (q, lang, g), rs in sorted(sub.items())]
    if breakdowns:
        report["breakdowns"] = breakdowns
    return report


def format_table(report: dict[str, Any]) -> str:
    lines = [f"{'query':<15}{'lang':<6}{'n':>5}{'P@1':>8}{'hit@5':>8}{'hit@10':>8}{'MRR@10':>8}{'nDCG@10':>9}"
             f"{'p50 ms':>9}{'p95 ms':>9}{'P@1 copies':>12}"]
    for r in report["rows"]:
        lines.append(
            f"{r['query']:<15}{r['lang']:<6}{r['n']:>5}{r['p_at_1']:>8.3f}{r['hit_at_5']:>8.3f}"
            f"{r['hit_at_10']:>8.3f}{r['mrr_at_10']:>8.3f}{r.get('ndcg_at_10', 0.0):>9.3f}"
            f"{r['latency_ms_p50']:>9.1f}{r['latency_ms_p95']:>9.1f}"
            f"{r.get('p_at_1_copies', r['p_at_1']):>12.3f}"
        )
    for a in report.get("averages", []):
        lines.append(
            f"{a['query']:<15}{'avg':<6}{'':>5}{a['p_at_1']:>8.3f}{'':>8}{'':>8}{a['mrr_at_10']:>8.3f}"
            f"{'':>9}{'':>9}{'':>9}{a.get('p_at_1_copies', a['p_at_1']):>12.3f}"
        )
    for dim, rows in (report.get("breakdowns") or {}).items():
        lines.append(f"\nby {dim}:")
        for r in rows:
            lines.append(
                "  "
                f"{r['query']:<15}{r['lang']:<4}{r['group']!s:<10}{r['n']:>5}{r['p_at_1']:>8.3f}{r['hit_at_10']:>8.3f}"
            )
    return "\n".join(lines)


def _completer(llm: LLM, prompts: PromptLibrary) -> Complete:
    async def complete(question: str, prior: Sequence[PriorTurn]) -> str | None:
        return await complete_question(llm, prompts, question, prior)

    return complete


def config_dict(config: RetrievalSettings, **extra: object) -> dict[str, object]:
    return {**config.model_dump(), **extra}


async def retrieval_report(
    settings: PipelineSettings,
    convs: Sequence[Sequence[QATurn]],
    pages: PageSource,
    *,
    documents_key: str,
    documents: str,
    questions: str,
    langs: Sequence[str],
    query_types: Sequence[str],
    strategy: str,
    strict_urls: bool,
    by: Sequence[str],
) -> dict[str, Any]:
    """Build (or reuse) the eval index for ``documents``, run every question, summarize with the config."""
    from pipeline.evaluation.index_cache import eval_expander, open_eval_index
    from pipeline.factory import make_llm_from, make_reranker_from

    llm = make_llm_from(settings) if any(qt in LLM_QUERY_TYPES for qt in query_types) else None
    index, embedder, sparse, _ = await open_eval_index(settings, documents_key, pages)
    try:
        cfg = settings.retrieval
        results = await run_retrieval_eval(
            convs,
            index=index,
            embedder=embedder,
            sparse=sparse,
            config=cfg,
            reranker=make_reranker_from(settings, embedder),
            langs=langs,
            query_types=query_types,
            strategy=strategy,
            strict_urls=strict_urls,
            expander=eval_expander(settings, documents_key, embedder, sparse),
            copies=await page_copies(pages()),
            complete=_completer(llm, PromptLibrary(settings.answer.resolved_prompts_dir)) if llm else None,
        )
        return summarize(results, by=by, config=config_dict(
            cfg, embedder=embedder.name, sparse=sparse.name, strategy=strategy,
            context_items=list(settings.ingest.context_items), table_indexing=settings.ingest.table_indexing,
            reranker=settings.models.reranker, documents=documents, questions=questions,
            url_match="strict" if strict_urls else "page-id", evidence=await index.count()))
    finally:
        await index.close()
        if llm is not None:
            await llm.close()
