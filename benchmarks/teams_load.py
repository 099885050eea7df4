"""Load test: N concurrent Teams conversations against the bot with a slow engine (its answer's words spread
over
``--llm-delay`` seconds, as an LLM streams them).

Two processes, like production: the "Microsoft side" (OpenID/JWKS + token endpoint, the Bot Connector, and
the sender of RS256-signed activities) runs in a child process; the bot (the real /api/messages endpoint with
JWT validation, the Connector client, the real SQLite Store) runs in this one with a FakeEngine that sleeps
``--llm-delay`` per answer in place of the LLM.

Half the conversations are personal chats (the answer streams: informative updates, the text at most once a
second, the final message), half group chats (the whole answer after a typing indicator), all at once. Reports
answers delivered, ack latency (HTTP response to each activity POST), and per path the time to the first
visible text (an informative update or the answer), to the first text of the answer itself, and to the final
message. Both processes read the same CLOCK_MONOTONIC.

    python benchmarks/teams_load.py [--conversations 50] [--llm-delay 3.0]
"""

from __future__ import annotations

import argparse
import asyncio
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

from fake_slack import FakeEngine
from fake_teams import APP_ID, APP_PASSWORD, TENANT, ActivitySender, FakeConnector, FakeIdentity

from bot.teams.app import TeamsPlatform
from evident.platforms import access_policy
from evident.settings import Settings
from pipeline.store import Store


def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(p / 100 * len(s) + 0.5) - 1))]


async def microsoft_side(conn: Connection, n: int) -> None:
    identity, connector = await FakeIdentity().start(), await FakeConnector().start()
    conn.send((identity.openid_url, identity.token_url))
    endpoint = await asyncio.to_thread(conn.recv)
    async with ActivitySender(endpoint, identity, connector.url + "/") as send:
        await send.send(send.personal("warm-up", chat="a:warm"))  # first request fetches keys and a token
        await connector.wait_for(lambda: any(p.activity.get("entities") for p in connector.posted), 10)
        connector.posted.clear()
        acts = [
            send.personal(f"question {i}?", chat=f"a:chat-{i}", user=f"user-{i}")
            if i % 2 == 0
            else send.group_chat(
                f"question {i}?", chat=f"19:group-{i}@thread.v2", mention=True, user=f"user-{i}"
            )
            for i in range(n)
        ]
        # signing is the Bot Framework's cost, not ours
        tokens = [identity.sign(a["serviceUrl"]) for a in acts]
        sent_at: dict[str, float] = {}

        async def one(act: dict[str, Any], token: str) -> float:
            sent_at[act["conversation"]["id"]] = t = time.monotonic()
            status, _ = await send.send(act, token=token)
            assert status == 200, status
            return time.monotonic() - t

        t0 = time.monotonic()
        acks = await asyncio.gather(*(one(a, t) for a, t in zip(acts, tokens, strict=True)))
        await connector.wait_for(
            lambda: sum(1 for p in connector.posted if p.activity.get("type") == "message") >= n, 60
        )
        wall = time.monotonic() - t0
    conn.send({"acks": acks, "wall": wall, "timings": timings(connector.posted, sent_at)})
    await connector.close()
    await identity.close()


def timings(posted: list[Any], sent_at: dict[str, float]) -> dict[str, dict[str, list[float]]]:
    """Per path (stream | whole): seconds from the question to the first visible text, the first answer text
    and the final message, one value per conversation."""
    out: dict[str, dict[str, list[float]]] = {"stream": {}, "whole": {}}
    for cid, t0 in sent_at.items():
        mine = [p for p in posted if p.conversation_id == cid and p.activity.get("text")]
        if not mine:
            continue
        path = "stream" if cid.startswith("a:") else "whole"
        final = next((p.at for p in mine if p.activity.get("type") == "message"), None)
        answer = next((p.at for p in mine if p.activity.get("type") == "message" or any(
            e.get("streamType") == "streaming" for e in p.activity.get("entities") or [])), None)
        for name, at in (("first visible", mine[0].at), ("first answer text", answer), ("final", final)):
            if at is not None:
                out[path].setdefault(name, []).append(at - t0)
    return out


def child(conn: Connection, n: int) -> None:
    asyncio.run(microsoft_side(conn, n))


async def bot_side(conn: Connection, delay_s: float) -> dict[str, Any]:
    openid_url, token_url = await asyncio.to_thread(conn.recv)
    settings = Settings.load(
        env={},
        teams_app_id=APP_ID,
        teams_app_password=APP_PASSWORD,
        teams_tenant_id=TENANT,
        teams_openid_url=openid_url,
        teams_token_url=token_url,
        user_rate_per_min=1000,
        teams_port=0,
    )
    with tempfile.TemporaryDirectory() as tmp:
        store = await Store.open(Path(tmp) / "evident.db")
        engine = FakeEngine(store, delay_s=delay_s)
        platform = TeamsPlatform(settings.teams, settings.chat, engine, access_policy(settings, engine),
                                 host="127.0.0.1")
        await platform.start()
        conn.send(f"http://127.0.0.1:{platform.port}/api/messages")
        result: dict[str, Any] = await asyncio.to_thread(conn.recv)
        await platform.drain(10)
        await platform.close()
        await store.close()
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--conversations", type=int, default=50)
    ap.add_argument("--llm-delay", type=float, default=3.0)
    args = ap.parse_args()
    parent_conn, child_conn = mp.Pipe()
    proc = mp.get_context("spawn").Process(target=child, args=(child_conn, args.conversations))
    proc.start()
    try:
        r = asyncio.run(bot_side(parent_conn, args.llm_delay))
    finally:
        proc.join(30)
    acks, t = r["acks"], r["timings"]
    delivered = sum(len(t[path].get("final", [])) for path in t)
    print(f"conversations={args.conversations} engine_delay={args.llm_delay:.3f}s wall={r['wall']:.3f}s")
    print(f"answers delivered: {delivered}/{args.conversations}")
    print(f"ack latency ms: p50={1000 * statistics.median(acks):.1f} p99={1000 * pct(acks, 99):.1f} "
          f"max={1000 * max(acks):.1f}")
    for path, label in (("stream", "personal chats, streamed"), ("whole", "group chats, whole message")):
        for name, values in t[path].items():
            print(f"{label:<28} {name:<18} s: p50={statistics.median(values):.2f} "
                  f"p95={pct(values, 95):.2f} (n={len(values)})")
    return 0 if delivered == args.conversations else 1


if __name__ == "__main__":
    raise SystemExit(main())
