"""The serving phase of ``wiki_scale.py``: `evident serve` (Slack's HTTP transport against the fake Slack
Web API in this process) answering a steady stream of questions while its own sync cycles pick up edits made
on the site just before each cycle."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import re
import socket
import sqlite3
import statistics
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp
from fake_slack import SIGNING_SECRET, EventSender, FakeSlack
from scale_procs import Proc, RssSampler

TAGS = re.compile(r"<[^>]+>|&[a-z]+;")
PROBE_EVERY_S = 5.0  # an edit-to-answer probe asks again this long after an answer without the edit


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def questions_from(sample: list[dict[str, str]], seed: int) -> list[str]:
    """Eight consecutive words of a sampled page's text (what someone half-remembers of it)."""
    rng, out = random.Random(seed), []
    for page in sample:
        words = TAGS.sub(" ", page["body"]).split()
        if len(words) > 20:
            start = rng.randrange(0, len(words) - 10)
            out.append(" ".join(words[start:start + 8]).strip(".") + "?")
    return out


class ServeRun:
    def __init__(self, env: dict[str, str], site_conn: Any, sampler: RssSampler, *, interval: int,
                 rate: float, share: float, seed: int, edit_seed: int | None = None) -> None:
        self.env, self.site, self.sampler = env, site_conn, sampler
        self.interval, self.rate, self.share, self.seed = interval, rate, share, seed
        self.edit_seed = seed if edit_seed is None else edit_seed
        self.sent: dict[str, float] = {}  # question ts -> when it was sent
        self.marks: set[str] = set()  # the edit-to-answer probes' questions (ts), kept out of the stream's
        self.probes: list[tuple[float, float]] = []  # (when, /healthz response seconds)
        self.missed: list[dict[str, str]] = []  # edits never seen in an answer
        self.inflight: set[asyncio.Task[int]] = set()

    def _site(self, command: str, arg: Any = None) -> Any:
        self.site.send((command, arg))
        return self.site.recv()

    async def run(self, sample: list[dict[str, str]], cycles: int) -> dict[str, Any]:
        self.slack = await FakeSlack().start()
        port = free_port()
        env = {**self.env, "SLACK_BOT_TOKEN": "xoxb-bench", "SLACK_SIGNING_SECRET": SIGNING_SECRET,
               "EVIDENT_SLACK_TRANSPORT": "http", "EVIDENT_HTTP_PORT": str(port),
               "EVIDENT_SLACK_API_URL": self.slack.base_url, "EVIDENT_SLACK_STREAM": "false",
               "EVIDENT_USER_RATE_PER_MIN": "100000", "EVIDENT_SYNC_INTERVAL_S": str(self.interval)}
        proc = self.proc = Proc("serve", [sys.executable, "-m", "evident", "serve"], env)
        self.sampler.watch("serve", proc.popen.pid)
        self.url = f"http://127.0.0.1:{port}"
        try:
            # this run's own threads and event ids: a kept data directory remembers an earlier run's
            events = EventSender(self.url + "/slack/events", epoch=int(time.time()))
            async with aiohttp.ClientSession() as http, events as send:
                self.http, self.send = http, send
                started = time.monotonic()
                await self._until_ready()
                ready_s = time.monotonic() - started
                t_end = await self._sync_line(after=0.0, within_s=1800)
                out = await self._measure(proc, questions_from(sample, self.seed), cycles, t_end)
                out["ready_s"] = round(ready_s, 1)
                return out
        finally:
            proc.popen.terminate()
            proc.wait(120)
            await self.slack.stop()
            self.proc_tail = proc.tail(20)
            self.log = [line for _, line in proc.lines]

    async def _until_ready(self) -> None:
        for _ in range(3600):
            with contextlib.suppress(aiohttp.ClientError):
                async with self.http.get(self.url + "/readyz") as r:
                    if r.status == 200:
                        return
            await asyncio.sleep(0.5)
        raise RuntimeError("serve never became ready")

    async def _sync_line(self, *, after: float, within_s: float) -> float:
        """When serve logged the end of a sync cycle (``sync: …``) after ``after``."""
        deadline = time.monotonic() + within_s
        while time.monotonic() < deadline:
            done = [t for t, line in self.proc.matching("sync: ") if t > after and " sync: " in f" {line}"]
            if done:
                return done[0]
            await asyncio.sleep(0.2)
        raise RuntimeError("no sync cycle ended in time")

    async def _measure(self, proc: Proc, questions: list[str], cycles: int, t_end: float) -> dict[str, Any]:
        tasks = [asyncio.create_task(self._probe()), asyncio.create_task(self._ask(questions))]
        windows: list[tuple[float, float]] = []
        idle: list[tuple[float, float]] = []
        results, to_answer = [], []
        for k in range(cycles):
            idle.append((t_end + 2, t_end + self.interval - 8))
            await asyncio.sleep(max(0.0, t_end + self.interval - 6 - time.monotonic()))
            before = await asyncio.to_thread(self._site, "stats")
            edited = await asyncio.to_thread(self._site, "edit",
                                             {"share": self.share, "seed": self.edit_seed + k})
            t_edit = time.monotonic()
            # staggered: three probes asked at the same moment every 5 s were bursts of three questions
            # at once that only the sync windows had, and the slowest answers there (the index worker
            # answers them one after another)
            markers = [asyncio.create_task(self._until_answered(e, t_edit, i * PROBE_EVERY_S / 3))
                       for i, e in enumerate(edited[:3])]
            t_line = await self._sync_line(after=t_edit, within_s=3600)
            after = await asyncio.to_thread(self._site, "stats")
            windows.append((t_edit + 6, t_line))
            results.append({"edited": len(edited), "seconds": round(t_line - t_edit - 6, 1),
                            "requests": after.get("requests", 0) - before.get("requests", 0),
                            "with bodies": after.get("with bodies", 0) - before.get("with bodies", 0)})
            to_answer += await asyncio.gather(*markers)
            # the markers may have outlasted cycles: the next edit goes 6 s before serve's next cycle
            t_end = t_line if time.monotonic() < t_line + self.interval - 10 else await self._sync_line(
                after=time.monotonic(), within_s=self.interval + 600)
        for task in tasks:
            task.cancel()
        await asyncio.sleep(5)  # answers still in flight
        return self._summary(windows, idle, results, to_answer)

    async def _probe(self) -> None:
        while True:
            t = time.monotonic()
            with contextlib.suppress(aiohttp.ClientError):
                async with self.http.get(self.url + "/healthz") as r:
                    await r.read()
                self.probes.append((t, time.monotonic() - t))
            await asyncio.sleep(0.05)

    async def _ask(self, questions: list[str]) -> None:
        for n in range(10**9):
            ev = self.send.mention(questions[n % len(questions)], channel=f"C{n % 20}", user=f"U{n % 50}")
            self.sent[ev["ts"]] = time.monotonic()
            self.inflight.add(task := asyncio.create_task(self.send.event(ev)))
            task.add_done_callback(self.inflight.discard)
            await asyncio.sleep(1 / self.rate)

    def _answers(self) -> dict[str, tuple[float, str]]:
        """Question ts -> (when its answer replaced the placeholder, the answer's text)."""
        thread_of = {ts: m.get("thread_ts") for (_, ts), m in self.slack.messages.items()}
        out: dict[str, tuple[float, str]] = {}
        for c in self.slack.calls:
            if c.method == "chat.update":
                thread = thread_of.get(c.args.get("ts", ""))
                if thread in self.sent and thread not in out:
                    out[thread] = (c.at, str(c.args.get("text", "")))
        return out

    async def _until_answered(self, edited: dict[str, str], t_edit: float, delay: float) -> float | None:
        """Seconds from the edit to the first answer showing the edit's new text (asked every 5 s, from
        ``delay`` after the edit)."""
        # only the new version has the word; asked with no other content word, as the reused index of a
        # `--reuse` run keeps earlier runs' code-word lines (the restarted site serves its pages' older
        # versions, which a sync does not take for changes), and short passages repeating "rotation code
        # word" outranked the long one holding the new word (3 of 6 probes missed in the 22nd run)
        question = f"What is {edited['word']}?"
        last = ""
        await asyncio.sleep(delay)
        while time.monotonic() - t_edit < 2 * self.interval + 60:
            ev = self.send.mention(question, channel="CMARK", user="UMARK")
            self.sent[ev["ts"]] = time.monotonic()
            self.marks.add(ev["ts"])
            await self.send.event(ev)
            for _ in range(120):
                got = self._answers().get(ev["ts"])
                if got is not None:
                    if edited["word"] in got[1]:
                        return round(got[0] - t_edit, 1)
                    last = got[1]
                    break
                await asyncio.sleep(0.25)
            await asyncio.sleep(PROBE_EVERY_S)
        self.missed.append({"page": edited["id"], "question": question, "last answer": last[:300]})
        return None

    def _summary(self, windows: list[tuple[float, float]], idle: list[tuple[float, float]],
                 cycles: list[dict[str, Any]], to_answer: list[float | None]) -> dict[str, Any]:
        answers = self._answers()
        # the steady stream's answers idle and during a sync (the same load in both); the edit probes', which
        # only the sync windows have, apart, and every question of the sync windows as before
        lat: dict[str, list[float]] = {"idle": [], "sync": [], "sync_probes": [], "sync_all": []}
        for ts, sent in self.sent.items():
            if ts in answers:
                where = "sync" if any(a <= sent <= b for a, b in windows) else \
                    "idle" if any(a <= sent <= b for a, b in idle) else None
                if where == "sync":
                    lat["sync_all"].append(answers[ts][0] - sent)
                if where:
                    lat[f"{where}_probes" if ts in self.marks else where].append(answers[ts][0] - sent)
        idle_probe = [d for t, d in self.probes if any(a <= t <= b for a, b in idle)]
        base = statistics.median(idle_probe) if idle_probe else 0.0
        stalls = [d - base for _, d in self.probes]
        # With ~60 questions in the sync windows the p99 is the slowest one or two: p90/p95, how many answers
        # took over twice the idle p99, and the latencies themselves say whether that is one question or many
        over = 2 * _pct(lat["idle"], 99) if lat["idle"] else float("inf")
        return {
            **{k: {"n": len(v), **{f"p{p}": _pct(v, p) for p in (50, 90, 95, 99)},
                   "over_2x_idle_p99": sum(x > over for x in v),
                   "latencies_s": sorted(round(x, 4) for x in v)} for k, v in lat.items()},
            "asked": len(self.sent), "answered": len(answers), "cycles": cycles,
            "edit_to_answer_s": to_answer,
            "missed": self.missed,
            "stalls": {"probes": len(stalls), "max_ms": max(stalls, default=0) * 1000,
                       "over_100ms": sum(s > 0.1 for s in stalls), "idle_median_ms": base * 1000},
            "stages_ms": self._stages(windows, idle),
            "cores": {"idle": self.sampler.cores(idle), "sync": self.sampler.cores(windows)},
        }

    def _stages(self, windows: list[tuple[float, float]], idle: list[tuple[float, float]]
                ) -> dict[str, dict[str, dict[str, float]]]:
        """Inside serve: each stage's p50/max (the store's per-turn timings) for turns stored idle or during
        a sync (the store's wall-clock date mapped onto this process's monotonic clock)."""
        offset = time.time() - time.monotonic()
        db = Path(self.env["EVIDENT_DATA_DIR"]) / "evident.db"
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
            rows = conn.execute("SELECT created_at, timings FROM turns").fetchall()
        by: dict[str, dict[str, list[float]]] = {"idle": {}, "sync": {}}
        for created, timings in rows:
            t = datetime.fromisoformat(created).timestamp() - offset
            where = "sync" if any(a <= t <= b for a, b in windows) else \
                "idle" if any(a <= t <= b for a, b in idle) else None
            if where and timings:
                for stage, ms in json.loads(timings).items():
                    by[where].setdefault(stage.removesuffix("_ms"), []).append(float(ms))
        return {where: {stage: {"n": len(v), "p50": round(statistics.median(v), 1), "max": round(max(v), 1)}
                        for stage, v in sorted(stages.items())} for where, stages in by.items()}


def _pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return round(s[min(len(s) - 1, max(0, round(p / 100 * len(s) + 0.5) - 1))], 3) if s else float("nan")
