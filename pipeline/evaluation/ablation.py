"""The paper's ablations (contextualization, table indexing, ranking), measured on our stack."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pipeline.evaluation.data import QATurn
from pipeline.evaluation.index_cache import PageSource, eval_expander, open_eval_index
from pipeline.evaluation.retrieval import run_retrieval_eval, summarize
from pipeline.settings import PipelineSettings

PAPER = {
    "context": {
        "none": 0.398,
        "+title": 0.483,
        "+heading": 0.448,
        "+before": 0.453,
        "+after": 0.460,
        "all": 0.528,
    },
    "tables": {"rows": 0.405, "tables": 0.492, "both": 0.528},
    "ranking": {"lexical": 0.430, "dense": 0.465, "hybrid": 0.528},
    "linearization": {},  # the README's figures do not include it
}


def variants(kind: str, settings: PipelineSettings) -> list[tuple[str, PipelineSettings]]:
    if kind == "context":
        return [
            ("none", settings.replace(context_items=())),
            ("+title", settings.replace(context_items=("title",))),
            ("+heading", settings.replace(context_items=("heading",))),
            ("+before", settings.replace(context_items=("before",))),
            ("+after", settings.replace(context_items=("after",))),
            ("all", settings.replace(context_items=("title", "heading", "before", "after"))),
        ]
    if kind == "tables":
        return [(t, settings.replace(table_indexing=t)) for t in ("rows", "tables", "both")]
    if kind == "linearization":
        return [(x, settings.replace(linearization=x)) for x in ("verbalized", "markdown", "plain")]
    if kind == "ranking":
        return [(m, settings.replace(retrieval_mode=m)) for m in ("lexical", "dense", "hybrid")]
    raise ValueError(kind)


async def run_ablation(
    kind: str,
    settings: PipelineSettings,
    documents_key: str,
    pages: PageSource,
    conversations: Sequence[Sequence[QATurn]],
    langs: Sequence[str],
    query_types: Sequence[str],
    strategy: str,
) -> dict[str, Any]:
    from pipeline.factory import make_reranker_from

    rows: list[dict[str, Any]] = []
    for name, s in variants(kind, settings):
        index, embedder, sparse, _ = await open_eval_index(s, documents_key, pages, progress=False)
        try:
            results = await run_retrieval_eval(
                conversations,
                index=index,
                embedder=embedder,
                sparse=sparse,
                config=s.retrieval,
                reranker=make_reranker_from(s, embedder),
                langs=langs,
                query_types=query_types,
                strategy=strategy,
                expander=eval_expander(s, documents_key, embedder, sparse),
            )
        finally:
            await index.close()
        rep = summarize(results)
        for r in rep["rows"]:
            rows.append({"ablation": kind, "variant": name, "paper_p_at_1": PAPER[kind].get(name), **r})
    lines = [f"{'variant':<10}{'query':<15}{'lang':<5}{'P@1':>7}{'MRR':>7}{'paper P@1':>11}"]
    for r in rows:
        paper = "" if r["paper_p_at_1"] is None else f"{r['paper_p_at_1']:.3f}"
        lines.append(
            f"{r['variant']:<10}{r['query']:<15}{r['lang']:<5}{r['p_at_1']:>7.3f}{r['mrr_at_10']:>7.3f}{paper:>11}"
        )
    return {"config": {"ablation": kind}, "rows": rows, "table": "\n".join(lines)}
