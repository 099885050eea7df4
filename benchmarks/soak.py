"""A soak: `evident serve` under a steady mixed Slack load for ``--minutes``, its own sync cycle every
``--interval`` seconds against a generated site with edits, the index worker killed once and the LLM endpoint
down for a while.

    python benchmarks/soak.py [--minutes 60] [--pages 2000] [--interval 180] [--rate 1.0]
                              [--kill-worker-at 20] [--llm-down-at 35] [--llm-down-s 60] [--json out.json]

The load, ``--rate`` events a second: new questions (50 %), follow-ups in answered threads (20 %), "Why this
answer?" explanations (15 %) and feedback clicks (15 %). The LLM is the test suite's OpenAI-compatible stub
(answers cite ``[Source 1]`` after 0.3-1.2 s), in a child process that is stopped for ``--llm-down-s``
seconds at ``--llm-down-at`` minutes; the site and the embeddings stand-in are ``wiki_scale.py``'s. Every
``--sample-s`` seconds: serve's RSS (with its children), open files and threads, from ``/proc``; its event
loop's live tasks and blocks over 100 ms, from its ``/metrics``.

Reports: the samples' first (after ``--warmup`` minutes) and last values and the largest; turns asked and
answered (a turn is lost when no answer or error reply replaced its placeholder); replies that are errors,
split into those during the LLM outage (expected: they say so) and the rest; ERROR log lines of serve.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import random
import signal
import sys
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import aiohttp
from fake_slack import SIGNING_SECRET, EventSender, FakeSlack
from scale_procs import EmbedServer, Proc, RssSampler, descendants
from scale_serve import free_port, questions_from
from stub_llm import StubLLMServer
from wiki_scale import env_for, sync_once
from wiki_site import serve_site

FAILED = ("went wrong", "unavailable", "could not", "couldn't", "try again")


def llm_main(conn: Connection, port: int) -> None:
    """The LLM stand-in; ``stop`` / ``start`` over ``conn`` take it down and up on the same port."""

    def make() -> StubLLMServer:
        return StubLLMServer(default_reply="The wiki says so [Source 1].", latency=(0.3, 1.2), port=port)

    async def main() -> None:
        stub: StubLLMServer | None = await make().start()
        while True:
            command = await asyncio.to_thread(conn.recv)
            if command in ("stop", "exit") and stub is not None:
                await stub.close()
                stub = None
            elif command == "start" and stub is None:
                stub = await make().start()
            conn.send(command)
            if command == "exit":
                return

    asyncio.run(main())


def proc_facts(pid: int) -> dict[str, float]:
    """RSS (MiB, with its descendants: the index worker), open files and threads of ``pid``."""
    out = {"rss_mib": 0.0, "fds": 0.0, "threads": 0.0}
    for p in [pid, *descendants(pid)]:
        try:
            status = Path(f"/proc/{p}/status").read_text().splitlines()
            out["fds"] += len(os.listdir(f"/proc/{p}/fd"))
        except OSError:
            continue
        for line in status:
            if line.startswith("VmRSS:"):
                out["rss_mib"] += int(line.split()[1]) / 1024
            elif line.startswith("Threads:"):
                out["threads"] += int(line.split()[1])
    return {k: round(v, 1) for k, v in out.items()}


class Soak:
    def __init__(self, args: argparse.Namespace, env: dict[str, str], llm: Connection, site: Connection,
                 sample: list[Any]) -> None:
        self.args, self.env, self.llm, self.site = args, env, llm, site
        self.questions = questions_from(sample, args.seed)
        self.rng = random.Random(args.seed)
        self.turns: dict[str, float] = {}  # question ts -> sent
        self.asked: dict[str, list[float]] = {}  # thread -> when its question and follow-ups were sent
        self.samples: list[dict[str, float]] = []
        self.events: dict[str, int] = {"question": 0, "follow-up": 0, "explain": 0, "feedback": 0}
        self.outage: tuple[float, float] | None = None
        self.inflight: set[asyncio.Task[int]] = set()

    async def run(self) -> dict[str, Any]:
        self.slack = await FakeSlack().start()
        port = free_port()
        env = {**self.env, "SLACK_BOT_TOKEN": "xoxb-soak", "SLACK_SIGNING_SECRET": SIGNING_SECRET,
               "EVIDENT_SLACK_TRANSPORT": "http", "EVIDENT_HTTP_PORT": str(port),
               "EVIDENT_SLACK_API_URL": self.slack.base_url, "EVIDENT_USER_RATE_PER_MIN": "100000",
               "EVIDENT_SYNC_INTERVAL_S": str(self.args.interval)}
        self.proc = Proc("serve", [sys.executable, "-m", "evident", "serve"], env)
        url = f"http://127.0.0.1:{port}"
        try:
            events = EventSender(url + "/slack/events", epoch=int(time.time()))  # this run's own threads
            async with aiohttp.ClientSession() as http, events as send:
                self.send, self.http, self.url = send, http, url
                for _ in range(1200):
                    try:
                        async with http.get(url + "/readyz") as r:
                            if r.status == 200:
                                break
                    except aiohttp.ClientError:
                        pass
                    await asyncio.sleep(0.5)
                await self._load()
        finally:
            self.proc.popen.send_signal(signal.SIGTERM)
            rc, _ = self.proc.wait(120)
            await self.slack.stop()
        return self._report(rc)

    async def _served_facts(self) -> dict[str, float]:
        """From serve's /metrics: the event loop's live tasks and its blocks over 100 ms so far."""
        wanted = {"evident_event_loop_tasks": "tasks", "evident_event_loop_blocks_total": "loop blocks"}
        try:
            async with self.http.get(self.url + "/metrics", timeout=aiohttp.ClientTimeout(total=2)) as r:
                text = await r.text()
        except (aiohttp.ClientError, TimeoutError):
            return {}
        return {wanted[name]: float(value) for name, _, value in
                (line.partition(" ") for line in text.splitlines()) if name in wanted}

    async def _load(self) -> None:
        start = time.monotonic()
        end = start + self.args.minutes * 60
        killed = downed = False
        next_sample, next_edit, edits = start, start + self.args.interval / 2, 0
        while time.monotonic() < end:
            now = time.monotonic()
            minute = (now - start) / 60
            if now >= next_sample:
                self.samples.append({"t_min": round(minute, 2), **proc_facts(self.proc.popen.pid),
                                     **await self._served_facts()})
                next_sample += self.args.sample_s
            if now >= next_edit:  # 1 % of the pages edited between two sync cycles
                edits += 1
                await asyncio.to_thread(self._site, "edit", {"share": 0.01, "seed": self.args.seed + edits})
                next_edit += self.args.interval
            if not killed and minute >= self.args.kill_worker_at:
                killed = self._kill_worker()
            if not downed and minute >= self.args.llm_down_at:
                downed = True
                outage = asyncio.create_task(self._outage())
            self._one_event()
            await asyncio.sleep(1 / self.args.rate)
        if downed:
            await outage
        await asyncio.sleep(30)  # answers in flight

    def _kill_worker(self) -> bool:
        for child in descendants(self.proc.popen.pid):
            if b"edge_worker" in Path(f"/proc/{child}/cmdline").read_bytes():
                os.kill(int(child), signal.SIGKILL)
                print(f"killed the index worker {child}", flush=True)
                return True
        return False

    async def _outage(self) -> None:
        t0 = time.monotonic()
        await asyncio.to_thread(self._llm, "stop")
        await asyncio.sleep(self.args.llm_down_s)
        await asyncio.to_thread(self._llm, "start")
        self.outage = (t0, time.monotonic())
        print(f"LLM down for {self.outage[1] - t0:.0f} s", flush=True)

    def _site(self, command: str, arg: Any) -> Any:
        self.site.send((command, arg))
        return self.site.recv()

    def _llm(self, command: str) -> None:
        self.llm.send(command)
        self.llm.recv()

    def _answers(self) -> dict[str, dict[str, Any]]:
        """Thread ts -> its reply: ended (``chat.stopStream``, or ``chat.update`` replacing a placeholder),
        with every text written into it (streamed chunks included)."""
        thread_of = {ts: m.get("thread_ts") for (_, ts), m in self.slack.messages.items()}
        out: dict[str, dict[str, Any]] = {}
        texts: dict[str, str] = {}
        for c in self.slack.calls:
            thread = thread_of.get(c.args.get("ts", ""))
            if thread not in self.turns:
                continue
            text = str(c.args.get("text") or c.args.get("markdown_text") or "")
            texts[thread] = texts.get(thread, "") + " " + text
            if c.method in ("chat.update", "chat.stopStream"):
                out[thread] = {**c.args, "_at": c.at, "_text": texts[thread]}
        return out

    def _one_event(self) -> None:
        answered = list(self._answers().items())
        roll = self.rng.random()
        kind = "question" if roll < 0.5 or not answered else "follow-up" if roll < 0.7 else \
            "explain" if roll < 0.85 else "feedback"
        self.events[kind] += 1
        n = sum(self.events.values())
        if kind == "question":
            ev = self.send.mention(self.questions[n % len(self.questions)], channel=f"C{n % 10}",
                                   user=f"U{n % 40}")
            self.turns[ev["ts"]] = time.monotonic()
            self.asked[ev["ts"]] = [self.turns[ev["ts"]]]
            self._post(self.send.event(ev))
            return
        thread, reply = self.rng.choice(answered[-200:])
        channel = str(reply.get("channel", "C1"))
        if kind == "follow-up":
            ev = self.send.mention("and what else does it say?", channel=channel, thread_ts=thread,
                                   user=f"U{n % 40}")
            self.asked.setdefault(thread, []).append(time.monotonic())
            self._post(self.send.event(ev))
        elif kind == "explain":
            self._post(self.send.event(self.send.reaction("explain", channel, reply["ts"])))
        else:
            turn = _turn_id(reply)
            if turn:
                self._post(self.send.block_action("evident_feedback", f"up:{turn}", channel=channel,
                                                  message_ts=reply["ts"], action_type="feedback_buttons"))

    def _post(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self.inflight.add(task)
        task.add_done_callback(self.inflight.discard)

    def _report(self, rc: int) -> dict[str, Any]:
        if self.args.json:  # serve's whole log beside the figures
            self.args.json.with_suffix(".log").write_text("\n".join(line for _, line in self.proc.lines))
        answers = self._answers()
        lost = [ts for ts in self.turns if ts not in answers]
        t0 = min(self.turns.values(), default=0.0)
        self.lost_at = [round(self.turns[ts] - t0, 1) for ts in lost]
        failed = {ts: a for ts, a in answers.items()
                  if any(f in a["_text"].lower() for f in FAILED)}
        lo, hi = (self.outage[0] - 5, self.outage[1]) if self.outage else (0.0, -1.0)
        in_outage = [ts for ts in failed if any(lo <= t <= hi for t in self.asked.get(ts, []))]
        t_first = min(self.turns.values(), default=0.0)
        other = [{"asked at (s)": round(self.turns[ts] - t_first, 1), "reply": failed[ts]["_text"][:160]}
                 for ts in failed if ts not in in_outage]
        warm = [s for s in self.samples if s["t_min"] >= self.args.warmup] or self.samples
        return {
            "minutes": self.args.minutes, "events": self.events, "turns": len(self.turns),
            "answered": len(answers), "lost": len(lost), "error replies": len(failed),
            "error replies during the LLM outage": len(in_outage), "other error replies": other,
            "error log lines": len(self.proc.matching(" ERROR ")) + len(self.proc.matching("Traceback")),
            "serve exit code": rc,
            "first": warm[0] if warm else {}, "last": warm[-1] if warm else {},
            "max": {k: max(s.get(k, 0) for s in warm) for k in ("rss_mib", "fds", "threads", "tasks")}
            if warm else {},
            "lost turns asked at (s)": self.lost_at,
            "outage (s)": [round(t - t0, 1) for t in self.outage] if self.outage else None,
            "samples": self.samples, "errors": [line for _, line in self.proc.matching(" ERROR ")][:20],
            "log tail": [line for _, line in list(self.proc.lines)[-40:]],
        }


def _turn_id(reply: dict[str, Any]) -> str:
    text = json.dumps(reply.get("blocks", []))
    marker = text.find('"up:')
    return text[marker + 4:text.find('"', marker + 4)] if marker >= 0 else ""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=60)
    ap.add_argument("--pages", type=int, default=2000)
    ap.add_argument("--spaces", type=int, default=10)
    ap.add_argument("--interval", type=int, default=180)
    ap.add_argument("--rate", type=float, default=1.0)
    ap.add_argument("--kill-worker-at", type=float, default=20)
    ap.add_argument("--llm-down-at", type=float, default=35)
    ap.add_argument("--llm-down-s", type=float, default=60)
    ap.add_argument("--sample-s", type=float, default=30)
    ap.add_argument("--warmup", type=float, default=5)
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    ctx = mp.get_context("spawn")
    site_conn, site_child = ctx.Pipe()
    site_proc = ctx.Process(target=serve_site, args=(site_child, args.pages, args.spaces, args.seed))
    site_proc.start()
    site = site_conn.recv()
    llm_conn, llm_child = ctx.Pipe()
    llm_port = free_port()
    llm_proc = ctx.Process(target=llm_main, args=(llm_child, llm_port), daemon=True)
    llm_proc.start()
    import tempfile

    with tempfile.TemporaryDirectory() as tmp, EmbedServer(ctx) as embed, RssSampler() as sampler:
        env = env_for(site, embed.url, Path(tmp) / "data")
        env.update({"EVIDENT_LLM_BASE_URL": f"http://127.0.0.1:{llm_port}/v1",
                    "EVIDENT_LLM_MODEL": "stub-model", "EVIDENT_LLM_API_KEY": "soak"})
        print("cold sync:", json.dumps(sync_once("sync", env, site_conn, sampler)), flush=True)
        site_conn.send(("sample", args.seed))
        result = asyncio.run(Soak(args, env, llm_conn, site_conn, site_conn.recv()).run())
    llm_conn.send("exit")
    llm_conn.recv()
    site_conn.send(("stop", None))
    site_conn.recv()
    site_proc.join(10)
    print(json.dumps({k: v for k, v in result.items() if k != "samples"}, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
