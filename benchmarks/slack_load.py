"""Load test: N concurrent Slack threads against the bot with a slow engine (its answer's words spread over
``--llm-delay`` seconds, as an LLM streams them).

Two processes, like production: the "Slack side" (fake Web API + the sender of signed Events API
payloads) runs in a child process; the bot (real HTTP transport with signature verification, Bolt, the
shared-session Web API client, the real SQLite Store) runs in this one with a FakeEngine in place of the
retrieval and the LLM.

N mentions in N channels, all at once. Every other channel refuses to stream (``channel_type_not_supported``,
as Slack answers where it does not stream), so half the answers take the streamed path (a "Searching the wiki"
task card, the pages read, the text in batches, the sources) and half the whole-message path (a placeholder,
then the whole answer in its place) in the same run. Reports answers delivered, ack latency (HTTP response to
each event POST) and per path the time to the first visible message, to the first answer text and to the final
answer. Both processes read the same CLOCK_MONOTONIC.

    python benchmarks/slack_load.py [--threads 50] [--llm-delay 3.0] [--assistant]

``--assistant`` asks in N assistant threads instead (DMs, one thread each; all stream).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing as mp
import statistics
import sys
import tempfile
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import aiohttp
from fake_slack import SIGNING_SECRET, EventSender, EventsServer, FakeEngine, FakeSlack
from slack_sdk.web.async_client import AsyncWebClient

from bot.slack.app import build_bot
from evident.platforms import access_policy
from evident.settings import Settings
from pipeline.store import Store


def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(p / 100 * len(s) + 0.5) - 1))]


# ---------------------------------------------------------------------- Slack side (child process)


def timings(slack: FakeSlack, sent_at: dict[str, float]) -> dict[str, dict[str, list[float]]]:
    """Per path (stream | whole): seconds from the question to the first visible message (the "Searching the
    wiki" task card or the placeholder), to the first answer text (streamed, or the answer replacing the
    placeholder) and to the final answer (with linked ``[n]`` markers), one value per thread."""
    thread_of = {ts: m.get("thread_ts") for (_, ts), m in slack.messages.items()}
    streamed = {m.get("thread_ts") for m in slack.messages.values() if "streaming" in m}
    seen: dict[str, dict[str, float]] = {}
    for c in slack.calls:
        thread = c.args.get("thread_ts") if c.method in ("chat.startStream", "chat.postMessage") else None
        thread = thread or thread_of.get(c.args.get("ts", ""))
        if thread not in sent_at:
            continue
        marks = seen.setdefault(thread, {"path": float(thread in streamed)})
        at = c.at - sent_at[thread]
        if c.method == "chat.postMessage" or (c.method == "chat.startStream" and thread in streamed):
            marks.setdefault("first visible", at)
        text = c.args.get("markdown_text") if "Stream" in c.method else c.args.get("text", "")
        if text and c.method != "chat.postMessage":
            marks.setdefault("first answer text", at)
        if c.method == "chat.update" and "|[1]>" in c.args.get("text", ""):
            marks["final"] = at
    out: dict[str, dict[str, list[float]]] = {"stream": {}, "whole": {}}
    for marks in seen.values():
        path = out["stream" if marks.pop("path") else "whole"]
        for name, at in marks.items():
            path.setdefault(name, []).append(at)
    return out


async def slack_side(conn: Connection, threads: int, assistant: bool = False) -> None:
    slack = await FakeSlack().start()
    conn.send(slack.base_url)
    bot_url = await asyncio.to_thread(conn.recv)
    async with EventSender(bot_url) as send:
        await send.event(send.mention("warm-up", channel="CWARM"))  # Bolt's first request calls auth.test
        await slack.wait_calls("chat.update", 1, within_s=10)
        slack.calls.clear()
        if assistant:
            events = [send.message(f"question {i}?", channel=f"D{i}", channel_type="im",
                                   thread_ts=send.new_ts(), user=f"U{i}") for i in range(threads)]
        else:  # every other channel refuses to stream (as Slack does for some): the whole-message path
            slack.no_stream_channels.update(f"C{i}" for i in range(1, threads, 2))
            events = [send.mention(f"question {i}?", channel=f"C{i}", user=f"U{i}") for i in range(threads)]
        bodies = [json.dumps(send.envelope(ev)) for ev in events]
        sent_at: dict[str, float] = {}

        async def one(ev: dict[str, Any], body: str) -> float:
            sent_at[ev.get("thread_ts") or ev["ts"]] = time.monotonic()
            status, _, elapsed = await send.post_raw(body, "application/json")
            assert status == 200, status
            return elapsed

        t0 = time.monotonic()
        acks = await asyncio.gather(*(one(ev, b) for ev, b in zip(events, bodies, strict=True)))
        with contextlib.suppress(AssertionError):  # missing answers are reported, not raised
            await slack.wait_for(lambda: sum("|[1]>" in c.get("text", "") for c in slack.of("chat.update"))
                                 >= threads, within_s=60)
        wall = time.monotonic() - t0
    conn.send({"acks": acks, "wall": wall, "timings": timings(slack, sent_at)})
    await slack.stop()


def child(conn: Connection, threads: int, assistant: bool) -> None:
    asyncio.run(slack_side(conn, threads, assistant))


# ---------------------------------------------------------------------- bot side (this process)


async def bot_side(conn: Connection, threads: int, delay_s: float) -> dict[str, Any]:
    base_url = await asyncio.to_thread(conn.recv)
    settings = Settings.load(env={}, slack_bot_token="xoxb-bench", slack_signing_secret=SIGNING_SECRET,
                             slack_transport="http", user_rate_per_min=1000)
    with tempfile.TemporaryDirectory() as tmp:
        store = await Store.open(Path(tmp) / "evident.db")
        try:
            return await _serve_bot(conn, settings, base_url, store, delay_s)
        finally:
            await store.close()


async def _serve_bot(conn: Connection, settings: Settings, base_url: str, store: Store,
                     delay_s: float) -> dict[str, Any]:
    async with aiohttp.ClientSession() as session:
        client = AsyncWebClient(token="xoxb-bench", base_url=base_url, session=session)
        engine = FakeEngine(store, delay_s=delay_s)
        bot = build_bot(settings.slack, settings.chat, engine, access_policy(settings, engine), client=client)
        transport = await EventsServer(bot.app).start()
        conn.send(f"http://127.0.0.1:{transport.port}/slack/events")
        result: dict[str, Any] = await asyncio.to_thread(conn.recv)
        await bot.drain(10)
        await transport.close()
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--threads", type=int, default=50)
    ap.add_argument("--llm-delay", type=float, default=3.0)
    ap.add_argument("--assistant", action="store_true", help="assistant threads with streamed answers")
    args = ap.parse_args()
    parent_conn, child_conn = mp.Pipe()
    proc = mp.get_context("spawn").Process(target=child, args=(child_conn, args.threads, args.assistant))
    proc.start()
    try:
        r = asyncio.run(bot_side(parent_conn, args.threads, args.llm_delay))
    finally:
        proc.join(30)
    acks, t = r["acks"], r["timings"]
    delivered = sum(len(path.get("final", [])) for path in t.values())
    print(f"threads={args.threads} engine_delay={args.llm_delay:.3f}s wall={r['wall']:.3f}s")
    print(f"answers delivered: {delivered}/{args.threads}")
    print(f"ack latency ms: p50={1000 * statistics.median(acks):.1f} p99={1000 * pct(acks, 99):.1f} "
          f"max={1000 * max(acks):.1f}")
    for path, label in (("stream", "streamed"), ("whole", "placeholder, then the whole answer")):
        n = len(t[path].get("final", []))
        if not n:
            continue
        print(f"{label} ({n} threads), seconds from the question, p50 / p95:")
        for name in ("first visible", "first answer text", "final"):
            values = t[path].get(name, [])
            if values:
                print(f"  {name:<18} {statistics.median(values):.2f} / {pct(values, 95):.2f}")
    return 0 if delivered == args.threads else 1


if __name__ == "__main__":
    raise SystemExit(main())
