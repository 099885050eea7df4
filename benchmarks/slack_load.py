"""Load test: N concurrent Slack threads against the bot with a slow (0.5 s) engine.

Two processes, like production: the "Slack side" (fake Web API + the sender of signed Events API
payloads) runs in a child process; the bot (real HTTP transport with signature verification, Bolt, the
shared-session Web API client, the real SQLite Store) runs in this one with a FakeEngine that sleeps
``--llm-delay`` per answer in place of the LLM.

Reports answers delivered, ack latency (HTTP response to each event POST, all N sent at once) and the
end-to-end overhead beyond the engine's time (event sent -> answer's chat.update reached Slack, minus
the engine delay). Both processes read the same CLOCK_MONOTONIC.

    python benchmarks/slack_load.py [--threads 50] [--llm-delay 0.5] [--assistant]

``--assistant`` asks in 50 assistant threads instead (DMs, one thread each): the engine streams its answer
word by word over the delay and the bot streams it into Slack (chat.startStream/appendStream/stopStream);
reported are the time to the first text (startStream) and to the finished answer (stopStream).
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


def _stream_times(slack: FakeSlack, sent_at: dict[str, float]) -> tuple[list[float], list[float]]:
    """(first text, finished) seconds after sending, per thread whose answer streamed in."""
    first, done, thread_of = {}, {}, {}
    for c in slack.calls:
        if c.method == "chat.startStream" and c.args.get("thread_ts") in sent_at:
            first.setdefault(c.args["thread_ts"], c.at - sent_at[c.args["thread_ts"]])
    for (_, ts), m in slack.messages.items():
        if m.get("thread_ts") in sent_at:
            thread_of[ts] = m["thread_ts"]
    for c in slack.calls:
        thread = thread_of.get(c.args.get("ts", ""))
        if c.method == "chat.stopStream" and thread is not None:
            done[thread] = c.at - sent_at[thread]
    return list(first.values()), list(done.values())


async def slack_side(conn: Connection, threads: int, assistant: bool = False) -> None:
    slack = await FakeSlack().start()
    conn.send(slack.base_url)
    bot_url = await asyncio.to_thread(conn.recv)
    async with EventSender(bot_url) as send:
        await send.event(send.mention("warm-up", channel="CWARM"))  # Bolt's first request calls auth.test
        await slack.wait_calls("chat.update", 1, within_s=10)
        slack.calls.clear()
        if assistant:
            events = []
            for i in range(threads):
                thread = send.new_ts()
                events.append(
                    send.message(
                        f"question {i}?", channel=f"D{i}", channel_type="im", thread_ts=thread, user=f"U{i}"
                    )
                )
        else:
            events = [
                send.mention(f"question {i}?", channel=f"C{i % 7}", user=f"U{i}") for i in range(threads)
            ]
        bodies = [json.dumps(send.envelope(ev)) for ev in events]
        sent_at: dict[str, float] = {}

        async def one(ev: dict[str, Any], body: str) -> float:
            sent_at[ev.get("thread_ts") or ev["ts"]] = time.monotonic()
            status, _, elapsed = await send.post_raw(body, "application/json")
            assert status == 200, status
            return elapsed

        t0 = time.monotonic()
        acks = await asyncio.gather(*(one(ev, b) for ev, b in zip(events, bodies, strict=True)))
        finished = "chat.stopStream" if assistant else "chat.update"
        with contextlib.suppress(AssertionError):  # missing answers are reported, not raised
            await slack.wait_for(lambda: len(slack.of(finished)) >= threads, within_s=30)
        wall = time.monotonic() - t0
    if assistant:
        first, done = _stream_times(slack, sent_at)
        conn.send({"acks": acks, "e2e": done, "first": first, "wall": wall})
        await slack.stop()
        return
    ts_to_thread = {m["ts"]: m.get("thread_ts") for m in slack.messages.values()}
    delivered_at = {}
    for c in slack.calls:
        if c.method == "chat.update" and "[1]" in c.args.get("text", ""):
            thread = ts_to_thread.get(c.args["ts"])
            if thread in sent_at:
                delivered_at[thread] = c.at - sent_at[thread]
    conn.send({"acks": acks, "e2e": list(delivered_at.values()), "wall": wall})
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
    ap.add_argument("--llm-delay", type=float, default=0.5)
    ap.add_argument("--assistant", action="store_true", help="assistant threads with streamed answers")
    args = ap.parse_args()
    parent_conn, child_conn = mp.Pipe()
    proc = mp.get_context("spawn").Process(target=child, args=(child_conn, args.threads, args.assistant))
    proc.start()
    try:
        r = asyncio.run(bot_side(parent_conn, args.threads, args.llm_delay))
    finally:
        proc.join(30)
    acks, e2e = r["acks"], [t - args.llm_delay for t in r["e2e"]]
    print(f"threads={args.threads} engine_delay={args.llm_delay:.3f}s wall={r['wall']:.3f}s")
    print(f"answers delivered: {len(e2e)}/{args.threads}")
    print(f"ack latency ms: p50={1000 * statistics.median(acks):.1f} p99={1000 * pct(acks, 99):.1f} "
          f"max={1000 * max(acks):.1f}")
    if e2e:
        print(f"end-to-end overhead beyond engine ms: p50={1000 * statistics.median(e2e):.1f} "
              f"p95={1000 * pct(e2e, 95):.1f} max={1000 * max(e2e):.1f}")
    first = r.get("first") or []
    if first:
        print(
            f"time to first text ms: p50={1000 * statistics.median(first):.1f} "
            f"p99={1000 * pct(first, 99):.1f}; "
            f"to the finished answer ms: p50={1000 * statistics.median(r['e2e']):.1f} "
            f"p99={1000 * pct(r['e2e'], 99):.1f}"
        )
    return 0 if len(e2e) == args.threads else 1


if __name__ == "__main__":
    raise SystemExit(main())
