"""Compare retrieval options on ConfQuestions in one run (same index, same machine state).

    python benchmarks/retrieval_sweep.py [--questions ../shared/confquestions/qa-dev.json]
        [--documents ../shared/confquestions/documents] [--only NAME,NAME]

Prints P@1 per (query type, language) and the EN+DE average for each named configuration.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from evident.settings import Settings
from pipeline.answer.settings import RetrievalSettings
from pipeline.evaluation.retrieval import run_retrieval_eval, summarize

sys.path.insert(0, str(Path(__file__).resolve().parent))
from dev_split import add_dev_arguments, open_dev


def configs(base: RetrievalSettings) -> dict[str, tuple[RetrievalSettings, str]]:
    """Named variants of the production retrieval settings. Page aggregation, dense pseudo-relevance feedback
    and language-aware fusion weights were measured here and hurt (BENCHMARKS.md); they are no longer
    options."""
    def vary(cfg: RetrievalSettings, **changes: object) -> RetrievalSettings:
        return cfg.model_copy(update=changes)

    p30 = vary(base, lexical_k=30, dense_k=30, continuity_boost=0.0)
    paper = vary(base, lexical_k=10, dense_k=10, continuity_boost=0.0)
    return {
        "paper_10_10": (paper, "topic"),
        "lexical30": (vary(p30, mode="lexical"), "topic"),
        "dense30": (vary(p30, mode="dense"), "topic"),
        "pool30": (p30, "topic"),
        "pool30_prevq": (p30, "prev_questions"),
        "pool30_rrf": (vary(p30, fusion="rrf"), "topic"),
        "cont0.5": (vary(p30, continuity_boost=0.5), "topic"),
        "cont1": (vary(p30, continuity_boost=1.0), "topic"),
        "cont0.5_prevq": (vary(p30, continuity_boost=0.5), "prev_questions"),
    }


async def main() -> None:
    ap = argparse.ArgumentParser()
    add_dev_arguments(ap)
    ap.add_argument("--only", default="")
    ap.add_argument("--query", default="completed,conversational")
    args = ap.parse_args()
    settings = Settings.load()
    convs, index, embedder, sparse, expander = await open_dev(args, settings)
    try:
        base = settings.retrieval
        wanted = set(filter(None, args.only.split(",")))
        for name, (cfg, strategy) in configs(base).items():
            if wanted and name not in wanted:
                continue
            results = await run_retrieval_eval(
                convs,
                index=index,
                embedder=embedder,
                sparse=sparse,
                config=cfg,
                langs=("en", "de"),
                query_types=tuple(args.query.split(",")),
                strategy=strategy,
                expander=expander,
            )
            rep = summarize(results)
            cells = " ".join(f"{r['query'][:4]}-{r['lang']}={r['p_at_1']:.3f}" for r in rep["rows"])
            avgs = " ".join(f"{a['query'][:4]}-avg={a['p_at_1']:.3f}" for a in rep.get("averages", []))
            print(f"{name:<18} {cells} | {avgs}", flush=True)
    finally:
        await index.close()


if __name__ == "__main__":
    asyncio.run(main())
