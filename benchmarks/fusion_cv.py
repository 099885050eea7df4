"""RRF vs score pooling (DBSF), chosen on one half of the dev conversations and scored on the other.

    python benchmarks/fusion_cv.py [--questions ../shared/confquestions/qa-dev.json]
        [--documents ../shared/confquestions/documents]

Conversations are split into two halves (alternating by sorted id). For each direction the fusion with the
better P@1 (completed + conversational, EN + DE) on the tuning half is picked and its P@1 on the held-out half
reported, next to both fusions' figures there. Paired per question: how many questions only one fusion gets
right at rank 1, and the two-sided sign-test p-value on those.
"""

from __future__ import annotations

import argparse
import asyncio
import math
from dataclasses import replace
from pathlib import Path

from connectors.local import LocalFolderConnector
from pipeline.evaluation.data import load_conversations
from pipeline.evaluation.index_cache import open_eval_index
from pipeline.evaluation.retrieval import QuestionResult, run_retrieval_eval
from pipeline.factory import retrieval_config
from pipeline.runtime.settings import Settings

REPO = Path(__file__).resolve().parent.parent
FUSIONS = ("rrf", "dbsf")


def p1(results: list[QuestionResult]) -> float:
    return sum(r.rank == 1 for r in results) / max(1, len(results))


def sign_test(wins: int, losses: int) -> float:
    n, k = wins + losses, min(wins, losses)
    if n == 0:
        return 1.0
    return min(1.0, 2 * sum(math.comb(n, i) for i in range(k + 1)) / 2**n)


def cells(results: list[QuestionResult]) -> str:
    out = []
    for qt in ("completed", "conversational"):
        for lang in ("en", "de"):
            out.append(f"{qt[:4]}-{lang} {p1([r for r in results if r.query_type == qt and r.lang == lang]):.3f}")
    return ", ".join(out)


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--questions", type=Path, default=REPO.parent / "shared/confquestions/qa-dev.json")
    ap.add_argument("--documents", type=Path, default=REPO.parent / "shared/confquestions/documents")
    args = ap.parse_args()
    settings = Settings.load()
    convs = load_conversations(args.questions)
    docs = args.documents.resolve()
    index, embedder, sparse, _ = await open_eval_index(
        settings, str(docs), lambda: LocalFolderConnector([docs]).iter_pages(), progress=False)
    try:
        base = retrieval_config(settings)
        results = {f: await run_retrieval_eval(convs, index=index, embedder=embedder, sparse=sparse,
                                               config=replace(base, fusion=f), strategy=settings.query_strategy)
                   for f in FUSIONS}
    finally:
        await index.close()
    ids = sorted({r.conv_id for r in results["rrf"]})
    halves = (set(ids[0::2]), set(ids[1::2]))
    for f in FUSIONS:
        print(f"{f:<5} all dev: {cells(results[f])}")
    for tune, test in ((0, 1), (1, 0)):
        on = {f: [r for r in results[f] if r.conv_id in halves[tune]] for f in FUSIONS}
        held = {f: [r for r in results[f] if r.conv_id in halves[test]] for f in FUSIONS}
        pick = max(FUSIONS, key=lambda f: p1(on[f]))
        print(f"tune on half {tune + 1} ({', '.join(f'{f} {p1(on[f]):.3f}' for f in FUSIONS)}) -> {pick}; "
              f"held-out half {test + 1}: {', '.join(f'{f} {p1(held[f]):.3f}' for f in FUSIONS)}")
        print(f"    held-out {pick}: {cells(held[pick])}")
    wins = sum(a.rank == 1 and b.rank != 1 for a, b in zip(results["dbsf"], results["rrf"], strict=True))
    losses = sum(b.rank == 1 and a.rank != 1 for a, b in zip(results["dbsf"], results["rrf"], strict=True))
    print(f"paired over all {len(results['rrf'])} questions: dbsf alone right {wins}, rrf alone right {losses}, "
          f"sign test p = {sign_test(wins, losses):.4f}")


if __name__ == "__main__":
    asyncio.run(main())
