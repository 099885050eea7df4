"""Retrieval options chosen on one half of the dev conversations and scored on the other (cross-validated
P@1).

    python benchmarks/retrieval_cv.py --vary fusion=rrf,dbsf
    python benchmarks/retrieval_cv.py --vary continuity_boost=0.25,0.5,1.0 [--set fusion=dbsf]
        [--questions ../shared/confquestions/qa-dev.json] [--documents ../shared/confquestions/documents]

    EVIDENT_LLM_BASE_URL=... python benchmarks/retrieval_cv.py --followup --vary fused_query_weight=0,0.5,1

``--followup`` scores follow-up retrieval with an LLM instead (query types conversational and fused: the
no-LLM query alone, and fused with the LLM-completed question; each turn is completed once, for every value).
``--vary`` names one ``RetrievalSettings`` field (or ``reranker``, e.g. ``reranker=none,sentences:dense``) and
the values to compare (the first is the baseline); ``--set`` fixes other fields. Conversations are split into
two halves (alternating by sorted id). For each direction the value with the best P@1 (completed +
conversational, EN + DE) on the tuning half is picked and its P@1 on the held-out half reported next to every
value's. Paired per question against the baseline: how many questions only one of the two gets right at rank
1, and the two-sided sign-test p-value on those.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from evident.settings import Settings
from pipeline.answer.completion import complete_question
from pipeline.answer.prompts import PromptLibrary
from pipeline.answer.query_builder import PriorTurn
from pipeline.answer.settings import RetrievalSettings
from pipeline.evaluation.retrieval import Complete, QuestionResult, run_retrieval_eval
from pipeline.factory import make_llm_from, make_reranker_from

sys.path.insert(0, str(Path(__file__).resolve().parent))
from dev_split import add_dev_arguments, open_dev


def p1(results: list[QuestionResult]) -> float:
    return sum(r.rank == 1 for r in results) / max(1, len(results))


def sign_test(wins: int, losses: int) -> float:
    n, k = wins + losses, min(wins, losses)
    if n == 0:
        return 1.0
    return min(1.0, 2 * sum(math.comb(n, i) for i in range(k + 1)) / 2**n)


def cells(results: list[QuestionResult]) -> str:
    out = []
    for qt in dict.fromkeys(r.query_type for r in results):
        for lang in ("en", "de"):
            out.append(
                f"{qt[:4]}-{lang} {p1([r for r in results if r.query_type == qt and r.lang == lang]):.3f}"
            )
    return ", ".join(out)


def parse(field: str, raw: str) -> Any:
    if field == "reranker":
        return raw
    annotation = {name: f.annotation for name, f in RetrievalSettings.model_fields.items()}.get(field)
    if annotation is None:
        raise SystemExit(f"unknown RetrievalSettings field {field!r}")
    kind = getattr(annotation, "__name__", str(annotation))  # "float", or "typing.Annotated[...]"
    if kind.startswith("int"):
        return int(raw)
    if kind.startswith("float"):
        return float(raw)
    if kind.startswith("bool"):
        return raw.lower() in ("1", "true", "yes")
    return raw


def memoized(llm: Any, prompts: PromptLibrary) -> Complete:
    """The LLM's completion of a turn, asked once per (question, earlier questions) for all values."""
    done: dict[tuple[str, ...], str | None] = {}

    async def complete(question: str, prior: Sequence[PriorTurn]) -> str | None:
        key = (question, *(p.question for p in prior))
        if key not in done:
            done[key] = await complete_question(llm, prompts, question, prior)
        return done[key]

    return complete


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vary", required=True, help="field=value,value,...")
    ap.add_argument("--set", default="", help="field=value;field=value")
    ap.add_argument("--followup", action="store_true", help="follow-ups with the configured LLM's completion")
    add_dev_arguments(ap)
    args = ap.parse_args()
    field, _, raw_values = args.vary.partition("=")
    values = [parse(field, v) for v in raw_values.split(",")]
    fixed = {k: parse(k, v) for k, _, v in (p.partition("=") for p in filter(None, args.set.split(";")))}
    settings = Settings.load()
    convs, index, embedder, sparse, expander = await open_dev(args, settings)
    llm = make_llm_from(settings) if args.followup else None
    if args.followup and llm is None:
        raise SystemExit("--followup needs an LLM endpoint (EVIDENT_LLM_BASE_URL)")
    complete = memoized(llm, PromptLibrary(settings.answer.resolved_prompts_dir)) if llm else None
    query_types = ("conversational", "fused") if args.followup else ("completed", "conversational")
    try:
        base = settings.retrieval.model_copy(update=fixed)
        results = {}
        # ``reranker`` names an EVIDENT_RERANKER value; any other field is a RetrievalSettings one
        for v in values:
            config = base if field == "reranker" else base.model_copy(update={field: v})
            reranker = (
                make_reranker_from(settings.replace(reranker=str(v)), embedder)
                if field == "reranker"
                else None
            )
            results[v] = await run_retrieval_eval(
                convs,
                index=index,
                embedder=embedder,
                sparse=sparse,
                config=config,
                reranker=reranker,
                strategy=settings.answer.query_strategy,
                expander=expander,
                query_types=query_types,
                complete=complete,
            )
    finally:
        await index.close()
        if llm is not None:
            await llm.close()
    ids = sorted({r.conv_id for r in results[values[0]]})
    halves = (set(ids[0::2]), set(ids[1::2]))
    for v in values:
        print(f"{field}={v}: all dev {p1(results[v]):.3f} ({cells(results[v])})")
    for tune, test in ((0, 1), (1, 0)):
        on = {v: [r for r in results[v] if r.conv_id in halves[tune]] for v in values}
        held = {v: [r for r in results[v] if r.conv_id in halves[test]] for v in values}
        pick = max(values, key=lambda v: p1(on[v]))
        print(f"tune on half {tune + 1} ({', '.join(f'{v} {p1(on[v]):.3f}' for v in values)}) -> {pick}; "
              f"held-out half {test + 1}: {', '.join(f'{v} {p1(held[v]):.3f}' for v in values)}")
    for v in values[1:]:
        pairs = list(zip(results[v], results[values[0]], strict=True))
        wins = sum(a.rank == 1 and b.rank != 1 for a, b in pairs)
        losses = sum(b.rank == 1 and a.rank != 1 for a, b in pairs)
        print(
            f"{field}={v} vs {values[0]} over {len(pairs)} questions: only {v} right {wins}, only "
            f"{values[0]} "
            f"right {losses}, sign test p = {sign_test(wins, losses):.4f}"
        )


if __name__ == "__main__":
    asyncio.run(main())
