"""The embedded index (Qdrant Edge) from 10k to 1M evidence: memory, disk, build time, latency, recall.

    python benchmarks/index_scale.py --sizes 10000,100000,300000,1000000 [--layouts before,default]
                                     [--vectors clustered|random] [--queries 200] [--set key=value,...]

Each (size, layout) runs in a child process of its own, so its peak RSS is the index's and not the
previous run's. The corpus is generated page by page (pages of 20 evidence, ~30 Zipf-distributed
sparse terms each) and written through the public ``Index`` API (``replace_page``), so the benchmark
itself holds one page at a time. Reported per run:

- writes: wall time of writing every page (including the segment builds writes trigger every
  ``optimize_every_points``); final optimize: ``EdgeIndex.optimize()`` at the end, as ingest does;
- peak RSS (VmHWM) and the RSS at the end split into anonymous memory (heap) and file-backed pages
  (memory-mapped index files the kernel can drop), disk (allocated blocks);
- hybrid RRF search p50/p95 through ``search()`` (the ``to_thread`` hop included);
- recall@10 of dense search against exact search over the same vectors (computed by regenerating the
  vectors chunk by chunk);
- ``page_hashes()`` (what every sync starts with).

``--vectors clustered`` (default) draws each page around a topic centroid, as text embeddings are
(same page cos ~0.66, same topic ~0.5, unrelated ~0); queries are new points of existing pages.
``--vectors random`` (uniform on the sphere) is HNSW's worst case. ``--access`` gives every page permissions
as a per-user sync writes them (20 spaces, each readable by its group and a site group; a quarter of the pages
restricted to three of 1,000 users and one of 200 groups) and times hybrid searches filtered for one reader
and for a channel of three, beside the unfiltered ones. Layouts: ``before`` is v0.1's
config (float32 vectors and HNSW in RAM, no quantization, Edge's default segment sizes); ``default``
is ``EdgeLayout()``; ``--set`` overrides fields of the default one (``--set hnsw_m=32,quantize=false``).
Nothing is downloaded; everything lives in a temp directory.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import qdrant_edge as qe

from pipeline.access.scope import EVERYTHING, AccessScope, PageAccess, group, page_access, user
from pipeline.index.edge import EdgeIndex
from pipeline.index.edge_layout import EdgeLayout, layout_from_pairs
from pipeline.types import Evidence, IndexPoint, SearchRequest, SparseVector

PAGE = 20
SPACES, USERS, GROUPS = 20, 1000, 200  # --access: 1,222 distinct principals
VOCAB = 30_000
TOPICS = 1000
DIM = 384


class BeforeIndex(EdgeIndex):
    """v0.1's collection config, for the "before" rows: no quantization, ef 100, optimized once at the end."""

    def __init__(self, path: Path) -> None:
        super().__init__(path, layout=EdgeLayout(quantize=False, search_ef=100, optimize_every_points=10**12))

    def _config(self, dense_dim: int) -> qe.EdgeConfig:
        return qe.EdgeConfig(
            vectors={"dense": qe.EdgeVectorParams(size=dense_dim, distance=qe.Distance.Cosine)},
            sparse_vectors={"sparse": qe.EdgeSparseVectorParams(modifier=qe.Modifier.Idf)},
        )


class Corpus:
    """Deterministic vectors per page: regenerate any page without keeping the corpus."""

    access = False  # give every page permissions (--access)

    def page_access(self, page: int) -> PageAccess:
        rng = np.random.default_rng([self.seed, 5, page])
        levels = [[group(f"space-{page % SPACES}"), group("site")]]
        if rng.random() < 0.25:
            levels.append([*(user(f"u{int(x)}") for x in rng.integers(0, USERS, 3)),
                           group(f"g{int(rng.integers(0, GROUPS))}")])
        return page_access(levels)

    def __init__(self, n: int, kind: str, seed: int = 7, noise: float = 0.8) -> None:
        self.n, self.kind, self.seed, self.noise = n, kind, seed, noise
        self.centroids = self._unit(np.random.default_rng([seed, 1]).normal(size=(TOPICS, DIM)))

    @staticmethod
    def _unit(m: np.ndarray) -> np.ndarray:
        return (m / np.linalg.norm(m, axis=-1, keepdims=True)).astype(np.float32)

    def page_vectors(self, page: int, count: int = PAGE, salt: int = 0) -> np.ndarray:
        rng = np.random.default_rng([self.seed, 2, page, salt])
        if self.kind == "random":
            return self._unit(rng.normal(size=(count, DIM)))
        topic = self.centroids[page % TOPICS]
        own = self._unit(np.random.default_rng([self.seed, 3, page]).normal(size=DIM))
        noise = self._unit(rng.normal(size=(count, DIM)))
        return self._unit(topic + 0.5 * own + self.noise * noise)

    def pages(self) -> Iterator[tuple[str, list[IndexPoint]]]:
        for page in range((self.n + PAGE - 1) // PAGE):
            count = min(PAGE, self.n - page * PAGE)
            yield self.page_id(page), self.page_points(page, self.page_vectors(page, count), "h1")

    @staticmethod
    def page_id(page: int) -> str:
        return f"page-{page}"

    def page_points(self, page: int, vectors: np.ndarray, page_hash: str) -> list[IndexPoint]:
        rng = np.random.default_rng([self.seed, 4, page])
        out = []
        for j, vec in enumerate(vectors):
            terms = np.unique(np.minimum(rng.zipf(1.3, size=30), VOCAB))
            ev = Evidence(
                id=str(uuid.uuid5(uuid.NAMESPACE_URL, f"{page}#{j}")), page_id=self.page_id(page),
                title=f"Page {page}", url=f"https://wiki/{page}", space=f"S{page % 5}", kind="passage",
                position=j, text="lorem ipsum " * 20, headings=("Heading",),
                access=self.page_access(page) if self.access else None,
            )
            out.append(
                IndexPoint(
                    ev,
                    "ctx " + ev.text,
                    tuple(vec.tolist()),
                    SparseVector(
                        tuple(int(t) for t in terms), tuple(float(x) for x in rng.integers(1, 4, len(terms)))
                    ),
                    page_hash,
                )
            )
        return out

    def queries(self, q: int) -> np.ndarray:
        rng = np.random.default_rng([self.seed, 5])
        pages = rng.integers(0, max(1, self.n // PAGE), size=q)
        return np.stack([self.page_vectors(int(p), 1, salt=1000 + i)[0] for i, p in enumerate(pages)])

    def exact_top(self, queries: np.ndarray, k: int = 10, salts: Mapping[int, int] | None = None
                  ) -> list[set[str]]:
        """Exact cosine top-k evidence ids, computed page chunk by page chunk; ``salts`` gives the pages
        written again since (page -> the salt of its current vectors)."""
        best_s = np.full((len(queries), k), -2.0, dtype=np.float32)
        best_i = np.zeros((len(queries), k), dtype=np.int64)
        chunk = 500
        for start in range(0, (self.n + PAGE - 1) // PAGE, chunk):
            pages = range(start, min(start + chunk, (self.n + PAGE - 1) // PAGE))
            mats: list[np.ndarray] = []
            ids: list[int] = []
            for p in pages:
                count = min(PAGE, self.n - p * PAGE)
                mats.append(self.page_vectors(p, count, salt=(salts or {}).get(p, 0)))
                ids.extend(p * PAGE + j for j in range(count))
            scores = queries @ np.concatenate(mats).T
            all_s = np.concatenate([best_s, scores], axis=1)
            all_i = np.concatenate([best_i, np.broadcast_to(np.array(ids), scores.shape)], axis=1)
            top = np.argpartition(-all_s, k - 1, axis=1)[:, :k]
            best_s = np.take_along_axis(all_s, top, 1)
            best_i = np.take_along_axis(all_i, top, 1)
        return [
            {str(uuid.uuid5(uuid.NAMESPACE_URL, f"{i // PAGE}#{i % PAGE}")) for i in row} for row in best_i
        ]


def memory() -> dict[str, float]:
    out: dict[str, float] = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmHWM", "VmRSS", "RssAnon", "RssFile"):
            out[key] = int(rest.split()[0]) / 1024  # MiB
    return out


def disk(path: Path) -> float:
    return sum(f.stat().st_blocks * 512 for f in path.rglob("*") if f.is_file()) / 2**20


def reader(rng: np.random.Generator) -> frozenset[str]:
    """One person: their account, the site group, their space's group and three other groups."""
    return frozenset({user(f"u{int(rng.integers(0, USERS))}"), group("site"),
                      group(f"space-{int(rng.integers(0, SPACES))}"),
                      *(group(f"g{int(x)}") for x in rng.integers(0, GROUPS, 3))})


async def timed(index: Any, queries: np.ndarray, scopes: list[AccessScope]) -> list[float]:
    """Hybrid search latencies (ms) of ``queries``, query i in ``scopes[i % len]``, the first five
    unclocked."""
    lat = []
    rng = np.random.default_rng(9)
    for i, q in enumerate(queries):
        terms = sorted({int(x) for x in np.minimum(rng.zipf(1.3, size=6), VOCAB)})
        req = SearchRequest(dense=tuple(q.tolist()), sparse=SparseVector(tuple(terms), (1.0,) * len(terms)),
                            mode="hybrid", lexical_k=10, dense_k=10, limit=10, scope=scopes[i % len(scopes)])
        t = time.perf_counter()
        await index.search(req)
        if i >= 5:
            lat.append((time.perf_counter() - t) * 1000)
    return lat


async def access_latencies(index: Any, queries: np.ndarray) -> dict[str, float]:
    rng = np.random.default_rng(11)
    one = [AccessScope.for_readers([reader(rng)], None) for _ in range(50)]
    channel = [AccessScope.for_readers([reader(rng) for _ in range(3)], None) for _ in range(50)]
    out = {}
    for name, scopes in (("p50_one_reader_ms", one), ("p50_channel_of_3_ms", channel)):
        out[name] = round(float(np.percentile(await timed(index, queries, scopes), 50)), 1)
    return out


async def dense_top(index: Any, queries: np.ndarray) -> list[set[str]]:
    """The evidence ids of each query's dense top 10, as the index finds them."""
    found = []
    for q in queries:
        request = SearchRequest(dense=tuple(q.tolist()), sparse=None, mode="dense", dense_k=10, limit=10,
                                scope=EVERYTHING)
        hits = await index.search(request)
        found.append({h.evidence.id for h in hits})
    return found


def recall_of(found: list[set[str]], exact: list[set[str]]) -> float:
    """Mean recall@10 of ``found`` against ``exact`` (``Corpus.exact_top``)."""
    return float(np.mean([len(f & e) / len(e) for f, e in zip(found, exact, strict=True)]))


async def one(n: int, layout_name: str, overrides: str, vectors: str, nq: int,
              with_access: bool = False) -> dict[str, Any]:
    corpus = Corpus(n, vectors)
    corpus.access = with_access
    queries = corpus.queries(nq)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "index"
        index = (BeforeIndex(path) if layout_name == "before"
                 else EdgeIndex(path, layout=layout_from_pairs(overrides, EdgeLayout())))
        await index.open(dense_dim=DIM, embedder="random")
        t = time.perf_counter()
        for page_id, points in corpus.pages():
            await index.replace_page(page_id, points[0].page_hash, points)
        upsert = time.perf_counter() - t
        mem_upsert = memory()
        t = time.perf_counter()
        await index.optimize()
        optimize = time.perf_counter() - t
        # Reopen, as a serving process would find it: what stays resident is the layout's, not the build's.
        await index.close()
        index = (BeforeIndex(path) if layout_name == "before"
                 else EdgeIndex(path, layout=layout_from_pairs(overrides, EdgeLayout())))
        t = time.perf_counter()
        await index.open(dense_dim=DIM, embedder="random")
        reopen = time.perf_counter() - t
        lat = await timed(index, queries, [EVERYTHING])
        filtered = await access_latencies(index, queries) if with_access else {}
        found = await dense_top(index, queries)
        t = time.perf_counter()
        pages = len(await index.page_hashes())
        hashes_ms = (time.perf_counter() - t) * 1000
        mem_end = memory()
        stats = await index.stats()
        size = disk(path)
        await index.close()
    recall = recall_of(found, corpus.exact_top(queries))
    return {
        "points": n,
        "layout": layout_name + (f"({overrides})" if overrides else ""),
        "vectors": vectors,
        "upsert_s": round(upsert, 1),
        "optimize_s": round(optimize, 1),
        "build_s": round(upsert + optimize, 1),
        "reopen_s": round(reopen, 2),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        "rss_after_upsert_mb": round(mem_upsert.get("VmRSS", 0)),
        "peak_upsert_mb": round(mem_upsert.get("VmHWM", 0)),
        "anon_after_upsert_mb": round(mem_upsert.get("RssAnon", 0)),
        "rss_end_anon_mb": round(mem_end.get("RssAnon", 0)),
        "rss_end_file_mb": round(mem_end.get("RssFile", 0)),
        "disk_mb": round(size),
        "segments": stats["segments"],
        "p50_ms": round(float(np.percentile(lat, 50)), 1),
        "p95_ms": round(float(np.percentile(lat, 95)), 1),
        "recall10": round(recall, 3),
        "page_hashes_ms": round(hashes_ms, 1),
        "pages": pages,
        **filtered,
    }


COLUMNS = [
    ("points", "points"),
    ("layout", "layout"),
    ("upsert_s", "writes s"),
    ("optimize_s", "final optimize s"),
    ("build_s", "build s"),
    ("peak_rss_mb", "peak RSS MB"),
    ("rss_end_anon_mb", "serving RSS anon MB"),
    ("rss_end_file_mb", "+ mapped MB"),
    ("disk_mb", "disk MB"),
    ("segments", "segments"),
    ("p50_ms", "hybrid p50 ms"),
    ("p95_ms", "p95 ms"),
    ("recall10", "recall@10"),
    ("page_hashes_ms", "page_hashes ms"),
    ("reopen_s", "open s"),
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="10000,100000")
    ap.add_argument("--layouts", default="before,default")
    ap.add_argument("--set", default="", help="overrides of the default layout: key=value,...")
    ap.add_argument("--vectors", choices=("clustered", "random"), default="clustered")
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--access", action="store_true", help="pages with permissions; filtered searches timed")
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        size, layout = int(args.sizes), args.layouts
        print(
            json.dumps(
                asyncio.run(
                    one(size, layout, args.set if layout != "before" else "", args.vectors, args.queries,
                        args.access)
                )
            )
        )
        return
    extra = [" p50 one reader ms", " p50 channel of 3 ms"] if args.access else []
    print("| " + " | ".join([*(title for _, title in COLUMNS), *extra]) + " |")
    print("|" + "---|" * (len(COLUMNS) + len(extra)), flush=True)
    for size in (int(s) for s in args.sizes.split(",")):
        for layout in args.layouts.split(","):
            cmd = [sys.executable, __file__, "--one", "--sizes", str(size), "--layouts", layout,
                   "--set", args.set, "--vectors", args.vectors, "--queries", str(args.queries),
                   *(["--access"] if args.access else [])]
            proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if proc.returncode != 0:
                print(f"| {size} | {layout} | failed: {proc.stderr.strip().splitlines()[-1:]} |", flush=True)
                continue
            row = json.loads(proc.stdout.strip().splitlines()[-1])
            columns = COLUMNS + ([("p50_one_reader_ms", "p50 one reader ms"),
                                  ("p50_channel_of_3_ms", "p50 channel of 3 ms")] if args.access else [])
            print("| " + " | ".join(str(row[key]) for key, _ in columns) + " |", flush=True)


if __name__ == "__main__":
    main()
