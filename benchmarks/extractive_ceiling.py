"""How much of the gold answer quoting can reach: the ceiling of any extractive answerer on ConfQuestions.

    python benchmarks/extractive_ceiling.py [--questions ../shared/confquestions/qa-dev.json]
        [--documents ../shared/confquestions/documents]

For every completed dev question (EN and DE) it retrieves with the default settings and reports the share of
turns where the normalised gold answer (``contains_gold``, as ``evident eval answers`` scores it) occurs in
some single unit (sentence or verbalized row) of the top 5 evidence, and in some whole evidence of the top
5 and top 10. An answerer that quotes cannot score above these.
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from connectors.local import LocalFolderConnector
from evident.settings import Settings
from pipeline.access.scope import EVERYTHING
from pipeline.answer.extractive import DENSE_HITS, _units
from pipeline.answer.retrieve import retrieve
from pipeline.evaluation.answers import contains_gold
from pipeline.evaluation.data import load_conversations
from pipeline.evaluation.index_cache import open_eval_index

REPO = Path(__file__).resolve().parent.parent


async def run(questions: Path, documents: Path) -> None:
    """``documents`` resolved (its path keys the cached eval index)."""
    settings = Settings.load()
    index, embedder, sparse, _ = await open_eval_index(
        settings, str(documents), lambda: LocalFolderConnector([documents]).iter_pages())
    config = settings.retrieval
    # n, unit@5, evidence@5, evidence@10
    counts: dict[str, list[int]] = {"en": [0, 0, 0, 0], "de": [0, 0, 0, 0]}
    try:
        for conv in load_conversations(questions):
            for turn in conv:
                for lang in ("en", "de"):
                    hits = (
                        await retrieve(
                            turn.completed[lang],
                            scope=EVERYTHING,
                            index=index,
                            embedder=embedder,
                            sparse=sparse,
                            config=config,
                        )
                    ).hits
                    texts = [h.evidence.text for h in hits]
                    row = counts[lang]
                    row[0] += 1
                    row[1] += any(
                        contains_gold(u, turn.answer, lang) for t in texts[:DENSE_HITS] for u in _units(t)
                    )
                    row[2] += any(contains_gold(t, turn.answer, lang) for t in texts[:5])
                    row[3] += any(contains_gold(t, turn.answer, lang) for t in texts[:10])
    finally:
        await index.close()
        embedder.close()
    print("lang      n   one unit of top 5   evidence of top 5   evidence of top 10")
    for lang, (n, unit, ev5, ev10) in counts.items():
        print(f"{lang:4} {n:6}   {unit / n:17.3f}   {ev5 / n:17.3f}   {ev10 / n:18.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--questions", type=Path, default=REPO.parent / "shared/confquestions/qa-dev.json")
    ap.add_argument("--documents", type=Path, default=REPO.parent / "shared/confquestions/documents")
    args = ap.parse_args()
    asyncio.run(run(args.questions, args.documents.resolve()))


if __name__ == "__main__":
    main()
