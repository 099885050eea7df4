"""Event-loop stalls while a sync rewrites pages of the embedded index, as ``evident serve`` would see them.

    python benchmarks/index_stall.py [--base-pages 15000] [--changed 10000] [--modes worker,in-process]

Builds an index of ``--base-pages`` pages (20 evidence each, as ``index_scale.py`` generates them),
then, per mode, replaces ``--changed`` of them with new versions (new hash, new vectors) through the
``Index`` API and optimizes at the end, as ``evident sync`` does, while the same event loop runs

- a ticker that sleeps 1 ms and records how late it wakes up (the stall a Slack ack would suffer), and
- a hybrid search every 100 ms (what a user asking meanwhile waits).

Modes: ``worker`` is ``ProcessEdgeIndex`` (the serve default, ``EVIDENT_INDEX_PROCESS=auto``),
``in-process`` is ``EdgeIndex`` in the bot's own process. Vectors are precomputed: embedding is not
part of what is measured.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from index_scale import DIM, PAGE, Corpus

from pipeline.access.scope import EVERYTHING
from pipeline.index.edge import EdgeIndex
from pipeline.index.edge_worker import ProcessEdgeIndex
from pipeline.types import SearchRequest, SparseVector


async def build(path: Path, corpus: Corpus) -> float:
    index = EdgeIndex(path)
    await index.open(dense_dim=DIM, embedder="random")
    t = time.perf_counter()
    for page_id, points in corpus.pages():
        await index.replace_page(page_id, points[0].page_hash, points)
    await index.optimize()
    await index.close()
    return time.perf_counter() - t


async def ticker(stop: asyncio.Event, lateness: list[float]) -> None:
    while not stop.is_set():
        t = time.perf_counter()
        await asyncio.sleep(0.001)
        lateness.append((time.perf_counter() - t - 0.001) * 1000)


async def searcher(index: Any, corpus: Corpus, stop: asyncio.Event, latency: list[float]) -> None:
    queries = corpus.queries(50)
    i = 0
    while not stop.is_set():
        req = SearchRequest(
            dense=tuple(queries[i % len(queries)].tolist()),
            sparse=SparseVector((1, 2, 3), (1.0, 1.0, 1.0)),
            mode="hybrid",
            lexical_k=10,
            dense_k=10,
            limit=10,
            scope=EVERYTHING,
        )
        t = time.perf_counter()
        await index.search(req)
        latency.append((time.perf_counter() - t) * 1000)
        i += 1
        await asyncio.sleep(0.1)


async def sync_under_load(path: Path, mode: str, corpus: Corpus, changed: int) -> dict[str, Any]:
    index: Any = ProcessEdgeIndex(path) if mode == "worker" else EdgeIndex(path)
    await index.open(dense_dim=DIM, embedder="random")
    stop = asyncio.Event()
    lateness: list[float] = []
    latency: list[float] = []
    tasks = [
        asyncio.create_task(ticker(stop, lateness)),
        asyncio.create_task(searcher(index, corpus, stop, latency)),
    ]
    t = time.perf_counter()
    for page in range(changed):
        points = corpus.page_points(page, corpus.page_vectors(page, PAGE, salt=7), f"v2-{mode}")
        await index.replace_page(corpus.page_id(page), points[0].page_hash, points)
    write_s = time.perf_counter() - t
    t = time.perf_counter()
    await index.optimize()
    optimize_s = time.perf_counter() - t
    stop.set()
    await asyncio.gather(*tasks)
    await index.close()
    late = np.array(lateness)
    return {"mode": mode, "write_s": write_s, "optimize_s": optimize_s, "stall_max_ms": float(late.max()),
            "stall_p99_ms": float(np.percentile(late, 99)), "stalls_over_50ms": int((late > 50).sum()),
            "search_p50_ms": float(np.percentile(latency, 50)), "search_max_ms": float(max(latency)),
            "searches": len(latency)}


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base-pages", type=int, default=15_000)
    ap.add_argument("--changed", type=int, default=10_000)
    ap.add_argument("--modes", default="worker,in-process")
    args = ap.parse_args()
    corpus = Corpus(args.base_pages * PAGE, "clustered")
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "base"
        print(
            f"base: {args.base_pages} pages, {args.base_pages * PAGE} evidence, built in "
            f"{await build(base, corpus):.0f} s; "
            f"sync: {args.changed} changed pages ({args.changed * PAGE} evidence)"
        )
        print(
            "| index | write s | optimize s | longest loop stall ms | p99 ms | stalls > 50 ms | search p50 "
            "ms | search max ms | searches |"
        )
        print("|---|---|---|---|---|---|---|---|---|", flush=True)
        for mode in args.modes.split(","):
            work = Path(tmp) / mode
            shutil.copytree(base, work)
            r = await sync_under_load(work, mode, corpus, args.changed)
            print(
                f"| {r['mode']} | {r['write_s']:.0f} | {r['optimize_s']:.1f} | {r['stall_max_ms']:.0f} | "
                f"{r['stall_p99_ms']:.1f} | "
                f"{r['stalls_over_50ms']} | {r['search_p50_ms']:.1f} | {r['search_max_ms']:.0f} | "
                f"{r['searches']} |",
                flush=True,
            )
            shutil.rmtree(work)


if __name__ == "__main__":
    asyncio.run(main())
