"""Hybrid (RRF) query latency: Qdrant Edge vs qdrant-client local mode, on random points.

    python benchmarks/index_latency.py [--points 20000] [--dim 384] [--queries 200]

Builds the same random corpus in both backends through the public ``Index`` API (pages of 20
evidence, written with ``replace_page``), then times ``search`` in hybrid mode. For Edge it also
reports the cost of the ``asyncio.to_thread`` hop (the same search called synchronously) and the
latency after ``optimize()``. Nothing is downloaded; everything lives in a temp directory.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pipeline.access.scope import EVERYTHING
from pipeline.index import common as ic
from pipeline.index.edge import EdgeIndex
from pipeline.index.qdrant import QdrantServerIndex
from pipeline.types import Evidence, IndexPoint, SearchRequest, SparseVector

PAGE_SIZE = 20
VOCAB = 30_000


def make_points(n: int, dim: int, seed: int = 0) -> dict[str, list[IndexPoint]]:
    """Random unit vectors and Zipf-distributed sparse terms (~30 per evidence), grouped by page."""
    rng = np.random.default_rng(seed)
    dense = rng.normal(size=(n, dim)).astype(np.float32)
    dense /= np.linalg.norm(dense, axis=1, keepdims=True)
    pages: dict[str, list[IndexPoint]] = {}
    for i in range(n):
        page_id = f"page-{i // PAGE_SIZE}"
        terms = np.unique(np.minimum(rng.zipf(1.3, size=30), VOCAB))
        tf = rng.integers(1, 4, size=len(terms)).astype(float)
        ev = Evidence(
            id=str(uuid.uuid5(uuid.NAMESPACE_URL, f"{page_id}#{i}")),
            page_id=page_id,
            title=f"Page {i // PAGE_SIZE}",
            url=f"https://wiki/{page_id}",
            space=f"S{i % 5}",
            kind="passage",
            position=i % PAGE_SIZE,
            text="lorem ipsum " * 20,
            headings=("Heading",),
        )
        pages.setdefault(page_id, []).append(
            IndexPoint(ev, "ctx " + ev.text, tuple(dense[i].tolist()),
                       SparseVector(tuple(int(t) for t in terms), tuple(tf.tolist())), f"h-{page_id}")
        )
    return pages


def make_queries(q: int, dim: int, seed: int = 1) -> list[SearchRequest]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(q):
        v = rng.normal(size=dim)
        v /= np.linalg.norm(v)
        terms = sorted({int(t) for t in np.minimum(rng.zipf(1.3, size=6), VOCAB)})
        out.append(
            SearchRequest(
                dense=tuple(v.tolist()),
                sparse=SparseVector(tuple(terms), (1.0,) * len(terms)),
                mode="hybrid",
                lexical_k=10,
                dense_k=10,
                limit=10,
                scope=EVERYTHING,
            )
        )
    return out


def pct(ms: list[float], p: float) -> float:
    return float(np.percentile(ms, p))


async def time_async(
    fn: Callable[[SearchRequest], Awaitable[Any]], queries: list[SearchRequest]
) -> list[float]:
    for q in queries[:5]:
        await fn(q)  # warm-up
    out = []
    for q in queries:
        t = time.perf_counter()
        await fn(q)
        out.append((time.perf_counter() - t) * 1000)
    return out


def time_sync(fn: Callable[[SearchRequest], Any], queries: list[SearchRequest]) -> list[float]:
    out = []
    for q in queries:
        t = time.perf_counter()
        fn(q)
        out.append((time.perf_counter() - t) * 1000)
    return out


def report(name: str, ms: list[float]) -> None:
    print(
        f"{name:<44} p50 {pct(ms, 50):8.2f} ms   p95 {pct(ms, 95):8.2f} ms   mean "
        f"{statistics.fmean(ms):8.2f} ms"
    )


async def ingest(index: Any, pages: dict[str, list[IndexPoint]]) -> float:
    t = time.perf_counter()
    for page_id, points in pages.items():
        await index.replace_page(page_id, points[0].page_hash, points)
    return time.perf_counter() - t


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--points", type=int, default=20_000)
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--skip-local", action="store_true", help="skip qdrant-client local mode")
    args = ap.parse_args()
    pages = make_points(args.points, args.dim)
    queries = make_queries(args.queries, args.dim)
    print(
        f"{args.points} points, dim {args.dim}, {len(pages)} pages, {len(queries)} hybrid queries (RRF, "
        "k=10+10)"
    )

    with tempfile.TemporaryDirectory() as tmp:
        edge = EdgeIndex(Path(tmp) / "edge")
        await edge.open(dense_dim=args.dim, embedder="random")
        print(f"edge ingest: {await ingest(edge, pages):.1f} s, stats: {await edge.stats()}")
        report("edge  search() via to_thread (unoptimized)", await time_async(edge.search, queries))
        report("edge  same search, synchronous (no hop)", time_sync(edge._search_sync, queries))
        t = time.perf_counter()
        await edge.optimize()
        print(f"edge optimize: {time.perf_counter() - t:.1f} s, segments {(await edge.stats())['segments']}")
        report("edge  search() via to_thread (optimized)", await time_async(edge.search, queries))
        report("edge  same search, synchronous (optimized)", time_sync(edge._search_sync, queries))
        t = time.perf_counter()
        n = len(await edge.page_hashes())
        print(f"edge page_hashes(): {n} pages in {(time.perf_counter() - t) * 1000:.1f} ms")
        await edge.close()

    if args.skip_local:
        return
    local = QdrantServerIndex(location=":memory:")
    await local.open(dense_dim=args.dim, embedder="random")
    # replace_page's filtered deletes scan every point in local mode (O(N) per page, quadratic in
    # total), so the local corpus is bulk-loaded as live points through the backend's batch writer.
    t = time.perf_counter()
    batch = [p for points in pages.values() for p in points]
    for i in range(0, len(batch), 1000):
        await local._upsert(batch[i : i + 1000], ic.LIVE)
    print(f"qdrant-client local bulk load: {time.perf_counter() - t:.1f} s, {await local.count()} points")
    report(
        "qdrant-client local mode search()",
        await time_async(local.search, queries[: max(20, len(queries) // 10)]),
    )
    await local.close()


if __name__ == "__main__":
    asyncio.run(main())
