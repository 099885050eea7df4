"""How long the segment builds after a sync take, for a layout of the embedded index.

    python benchmarks/segment_builds.py [--base-pages 5000] [--plans 1x1250,10x250]
                                        [--layout segment_number=2,deleted_threshold=0.2]
                                        [--vectors clustered|random] [--noise 0.8] [--recall]

Builds an index of ``--base-pages`` pages (20 evidence each, as ``index_scale.py`` generates them) with the
layout (``EdgeLayout`` defaults, changed by ``--layout key=value,...``), then per plan ``BxP`` on a copy:
``B`` times, replace the next ``P`` pages with new versions (new vectors) and optimize, as a sync in serve
does (``QuietBuilds``). Prints each optimize's seconds and the segment count, then the hybrid search latency
over the result; with ``--recall``, dense recall@10 against exact search over the vectors the index holds,
before and after the plan (how deletions and rebuilt segments change it). In ``evident serve`` the index
worker answers one request at a time, so an optimize's seconds are what a question asked meanwhile waits.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from index_scale import DIM, PAGE, Corpus, dense_top, recall_of

from pipeline.access.scope import EVERYTHING
from pipeline.index.edge import EdgeIndex
from pipeline.index.edge_layout import EdgeLayout, layout_from_pairs
from pipeline.types import SearchRequest, SparseVector


async def build(path: Path, corpus: Corpus, layout: EdgeLayout) -> tuple[float, object]:
    index = EdgeIndex(path, layout=layout)
    await index.open(dense_dim=DIM, embedder="random")
    t = time.perf_counter()
    for page_id, points in corpus.pages():
        await index.replace_page(page_id, points[0].page_hash, points)
    await index.optimize()
    segments = (await index.stats())["segments"]
    await index.close()
    return time.perf_counter() - t, segments


async def search_ms(index: EdgeIndex, corpus: Corpus) -> tuple[float, float]:
    took = []
    for q in corpus.queries(200):
        request = SearchRequest(dense=tuple(q.tolist()), sparse=SparseVector((1, 2, 3), (1.0, 1.0, 1.0)),
                                mode="hybrid", lexical_k=30, dense_k=30, limit=10, scope=EVERYTHING)
        t = time.perf_counter()
        await index.search(request)
        took.append((time.perf_counter() - t) * 1000)
    return float(np.percentile(took, 50)), float(np.percentile(took, 99))


async def recall(index: EdgeIndex, corpus: Corpus, salts: dict[int, int]) -> float:
    """Dense recall@10 against exact search over the vectors the index holds now (200 queries)."""
    queries = corpus.queries(200)
    return recall_of(await dense_top(index, queries), corpus.exact_top(queries, salts=salts))


async def run_plan(path: Path, corpus: Corpus, layout: EdgeLayout, batches: int, per: int,
                   with_recall: bool = False) -> None:
    index = EdgeIndex(path, layout=layout)
    await index.open(dense_dim=DIM, embedder="random")
    salts: dict[int, int] = {}
    if with_recall:
        print(f"dense recall@10 before the plan: {await recall(index, corpus, salts):.3f}", flush=True)
    page = 0
    for b in range(batches):
        t = time.perf_counter()
        for _ in range(per):
            points = corpus.page_points(page, corpus.page_vectors(page, PAGE, salt=11 + b), f"v{b}-{page}")
            await index.replace_page(corpus.page_id(page), points[0].page_hash, points)
            salts[page] = 11 + b
            page += 1
        written = time.perf_counter() - t
        t = time.perf_counter()
        await index.optimize()
        built = time.perf_counter() - t
        segments = (await index.stats())["segments"]
        print(f"| {b + 1} | {per * PAGE:,} | {written:.1f} | {built:.1f} | {segments} |", flush=True)
    p50, p99 = await search_ms(index, corpus)
    print(f"hybrid search after the plan: p50 {p50:.1f} ms, p99 {p99:.1f} ms", flush=True)
    if with_recall:
        print(f"dense recall@10 after the plan: {await recall(index, corpus, salts):.3f}", flush=True)
    await index.close()


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base-pages", type=int, default=5_000)
    ap.add_argument("--plans", default="1x1250,10x250", help="BxP: B rounds of P replaced pages each")
    ap.add_argument("--layout", default="", help="EdgeLayout overrides, e.g. segment_number=2")
    ap.add_argument("--vectors", choices=("clustered", "random"), default="clustered")
    ap.add_argument("--noise", type=float, default=0.8,
                    help="clustered vectors: weight of each evidence's own noise (more: harder for HNSW)")
    ap.add_argument("--recall", action="store_true", help="dense recall@10 before and after each plan")
    args = ap.parse_args()
    layout = layout_from_pairs(args.layout)
    corpus = Corpus(args.base_pages * PAGE, args.vectors, noise=args.noise)
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "base"
        seconds, segments = await build(base, corpus, layout)
        print(f"layout: {layout}\nbase: {args.base_pages:,} pages, {args.base_pages * PAGE:,} evidence, "
              f"built in {seconds:.0f} s, {segments} segments")
        for plan in args.plans.split(","):
            batches, per = (int(x) for x in plan.split("x"))
            print(f"\nplan {plan}\n| round | points replaced | write s | optimize s | segments |")
            print("|---|---|---|---|---|")
            work = Path(tmp) / plan
            shutil.copytree(base, work)
            await run_plan(work, corpus, layout, batches, per, args.recall)
            shutil.rmtree(work)


if __name__ == "__main__":
    asyncio.run(main())
