"""What DBSCAN's ε merges among the evidence one answer is generated from, for the configured embedder.

    EVIDENT_DATA_DIR=/tmp/evB python benchmarks/cluster_eps.py \
        --questions ../shared/confquestions/qa-dev.json --documents ../shared/confquestions/documents \
        [--sample 80] [--eps 0.005,0.01,0.02,0.05,0.1]

The paper's ε = 0.005 (cosine distance) was chosen for bge-m3. Distances depend on the embedding model,
so this prints, over the evidence shown to the generator for sampled completed questions (no LLM needed):
the distribution of pairwise distances for same-page and cross-page pairs, and for each ε the mean
number of clusters, the share of answers with at least one merge, and the *purity* of merges (the share
of same-cluster pairs that lie on one page). Merging across pages is what hurts URL-level attribution.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from itertools import combinations
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from evident.settings import Settings
from pipeline.access.scope import EVERYTHING
from pipeline.attribution.cluster import cluster_embeddings
from pipeline.attribution.scoring import embed
from pipeline.evaluation.answers import eval_engine, temp_store_path
from pipeline.evaluation.attribution_eval import select_questions
from pipeline.evaluation.data import load_conversations
from pipeline.evaluation.index_cache import open_eval_index


async def main(args: argparse.Namespace) -> None:
    from evident.eval_cmds import page_source

    settings = Settings.load()
    if settings.llm.base_url:
        sys.exit("unset EVIDENT_LLM_BASE_URL: this benchmark needs retrieval only")
    documents: Path = args.documents  # resolved before the loop starts (no blocking I/O in here)
    index, embedder, sparse, _ = await open_eval_index(settings, str(documents), page_source(documents))
    engine = await eval_engine(
        settings, index=index, embedder=embedder, sparse=sparse, store_path=temp_store_path()
    )
    eps_values = [float(e) for e in args.eps.split(",")]
    same_page: list[float] = []
    cross_page: list[float] = []
    closest: list[tuple[float, str, str]] = []  # cross-page pairs, to eyeball what a small ε merges
    clusters: dict[float, list[int]] = {e: [] for e in eps_values}
    merged_answers: dict[float, int] = dict.fromkeys(eps_values, 0)
    pure_pairs: dict[float, list[int]] = {e: [0, 0] for e in eps_values}
    langs = ("en", "de") if args.lang == "both" else (args.lang,)
    questions = select_questions(args.conversations, langs, None, args.sample)
    try:
        for n, (lang, turn) in enumerate(questions, start=1):
            result = await engine.ask(
                f"eps:{lang}:{turn.conv_id}:{turn.turn}", turn.completed[lang], scope=EVERYTHING
            )
            hits = result.answer.evidence
            if len(hits) < 2:
                continue
            vectors = await embed(embedder, [engine._cluster_text(h.evidence) for h in hits])
            pages = [h.evidence.url or h.evidence.page_id for h in hits]
            for i, j in combinations(range(len(hits)), 2):
                distance = float(1.0 - vectors[i] @ vectors[j])
                (same_page if pages[i] == pages[j] else cross_page).append(distance)
                if pages[i] != pages[j] and distance < 0.01:
                    closest.append((distance, engine._cluster_text(hits[i].evidence),
                                    engine._cluster_text(hits[j].evidence)))
            for eps in eps_values:
                groups = cluster_embeddings(vectors, eps=eps, min_samples=settings.attribution.min_pts)
                clusters[eps].append(len(groups))
                merged_answers[eps] += any(len(g) > 1 for g in groups)
                for group in groups:
                    for i, j in combinations(group, 2):
                        pure_pairs[eps][0] += pages[i] == pages[j]
                        pure_pairs[eps][1] += 1
            if n % 20 == 0:
                print(f"  {n}/{len(questions)} questions", file=sys.stderr)
    finally:
        await engine.store.close()
        await index.close()

    answers = len(clusters[eps_values[0]])
    print(f"embedder {settings.models.embedder}, final_k {settings.retrieval.final_k}, {answers} answers "
          f"({len(questions)} sampled questions, {'+'.join(langs)})")
    for name, values in (("same-page pairs", same_page), ("cross-page pairs", cross_page)):
        if values:
            q = np.percentile(values, [1, 5, 25, 50])
            print(f"{name:<17} n={len(values):<5} cosine distance p1 {q[0]:.4f}  p5 {q[1]:.4f}  "
                  f"p25 {q[2]:.4f}  p50 {q[3]:.4f}  min {min(values):.4f}")
    for distance, a, b in sorted(closest)[: args.show]:
        print(f"  cross-page {distance:.4f}: {a[:90]!r}\n{'':>21}{b[:90]!r}")
    print(
        f"\n{'eps':>7} {'clusters/answer':>16} {'answers with a merge':>21} {'merged pairs':>13} "
        f"{'purity':>7}"
    )
    for eps in eps_values:
        pure, pairs = pure_pairs[eps]
        purity = f"{pure / pairs:.3f}" if pairs else "-"
        print(f"{eps:>7g} {np.mean(clusters[eps]):>16.2f} {merged_answers[eps] / max(1, answers):>21.3f} "
              f"{pairs:>13} {purity:>7}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--questions", required=True)
    parser.add_argument("--documents", required=True)
    parser.add_argument("--lang", choices=["en", "de", "both"], default="both")
    parser.add_argument("--sample", type=int, default=80, help="questions per language, spread over the file")
    parser.add_argument("--eps", default="0.005,0.01,0.02,0.05,0.1")
    parser.add_argument("--show", type=int, default=0, help="print the N closest cross-page pairs")
    arguments = parser.parse_args()
    arguments.documents = Path(arguments.documents).resolve()
    arguments.conversations = load_conversations(Path(arguments.questions))
    asyncio.run(main(arguments))
