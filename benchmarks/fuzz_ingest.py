"""Fuzz the whole ingest path with generated hostile pages and print what happened.

    python benchmarks/fuzz_ingest.py [--n 1000] [--seed 0] [--embedder default|hash] [--json out.json]

The cases come from ``tests/fuzzgen.py`` (16 categories, canary words in visible text); they are
written to a temporary export folder, ingested in this process with the default stack (``--embedder
default``: the settings' embedder behind the embedding cache, BM25, Qdrant Edge) or a hash embedder,
and checked: crashes (an exception out of ingest), hangs (a page over 60 s), silent drops (a canary
neither indexed nor its page reported), unreported bad files, pages reported for low text coverage,
index consistency. Peak RSS is the whole process's (``ru_maxrss``), model included.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from fuzzgen import iter_cases, run_cases
from helpers import HashEmbedder

from evident.settings import Settings
from pipeline.factory import ingest_options, make_embedder_from, make_sparse_from

HANG_S = 60.0


async def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--embedder", choices=["default", "hash"], default="default")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="evident-fuzz-") as tmp:
        work = Path(tmp)
        settings = Settings.load(data_dir=work / "data")
        embedder = make_embedder_from(settings) if args.embedder == "default" else HashEmbedder()
        sparse = make_sparse_from(settings, embedder)
        start = time.perf_counter()
        result = await run_cases(iter_cases(args.n, args.seed), work, embedder=embedder, sparse=sparse,
                                 options=ingest_options(settings))
        wall = time.perf_counter() - start
    report = result.report
    figures = {
        "cases": result.cases,
        "embedder": embedder.name if args.embedder == "default" else "hash (test)",
        "crashes": len(result.crashes),
        "hangs": int(result.slowest_page[1] > HANG_S),
        "silent_drops": len(result.silent_drops),
        "unreported_bad_files": len(result.unreported),
        "inconsistent_index": len(result.inconsistent),
        "pages_indexed": result.indexed_pages,
        "pages_failed": result.failed,
        "pages_partial": result.partial,
        "coverage_reports": result.coverage_reports,
        "evidence": report.evidence if report else 0,
        "slowest_page": f"{result.slowest_page[0]} {result.slowest_page[1]:.2f} s",
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "wall_s": round(wall, 1),
    }
    width = max(len(k) for k in figures)
    for key, value in figures.items():
        print(f"{key:<{width}}  {value}")
    for line in (
        *result.crashes,
        *result.silent_drops[:20],
        *result.unreported[:20],
        *result.inconsistent[:20],
    ):
        print("  ", line)
    if args.json:
        args.json.write_text(json.dumps({**figures, "details": {
            "crashes": result.crashes, "silent_drops": result.silent_drops, "unreported": result.unreported,
            "inconsistent": result.inconsistent}}, indent=2))
    bad = figures["crashes"] or figures["hangs"] or figures["silent_drops"] or figures["unreported_bad_files"]
    return 1 if bad or figures["inconsistent_index"] else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
