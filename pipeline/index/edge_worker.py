"""The embedded index in its own process, so Qdrant Edge never holds the bot's GIL.

Qdrant Edge keeps the GIL for the whole of each call: building the HNSW graph of a 100k-point segment
froze every thread of the calling process for seconds (``asyncio.to_thread`` does not help), and
loading a large shard for hundreds of milliseconds. ``ProcessEdgeIndex`` is the ``Index`` that an
``EdgeIndex(path, ...)`` would be, running in a child process (``python -m pipeline.index.edge_worker``);
the bot's process only pickles requests and results. ``evident serve`` uses it by default
(``EVIDENT_INDEX_PROCESS=auto``).

- One request at a time, in order: the child is one ``EdgeIndex``. An optimize delays searches queued
  behind it, never the event loop; with ``build_quiet_s`` it waits for a quiet moment (``QuietBuilds``).
- The child holds the directory's lease like any evident process, so CLI commands still get the index
  handed over between operations.
- A crash of the child fails the call in flight with ``IndexError_``; the next call starts a new child
  and opens the index again with the same arguments.
- ``export_points`` moves one page per request.
- ``trace_file`` (``EVIDENT_INDEX_TRACE_FILE``): a JSON line per request, for finding what a slow search
  waited for (``trace_line``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from pipeline import errors
from pipeline.access.scope import AccessScope, PageAccess
from pipeline.errors import EvidentError, IndexError_
from pipeline.index.edge_layout import EdgeLayout
from pipeline.index.edge_manifest import read_recipe
from pipeline.index.lease import describe_process
from pipeline.index.quiet_builds import QuietBuilds
from pipeline.runtime.child import spawn_child, stop_child
from pipeline.types import Evidence, Hit, IndexPoint, SearchRequest

log = logging.getLogger("evident.index")

_OPS = frozenset(
    {
        "open",
        "close",
        "optimize",
        "drop",
        "replace_page",
        "delete_pages",
        "set_access",
        "missing_access",
        "search",
        "search_many",
        "page_hashes",
        "page_spaces",
        "get",
        "count",
        "stats",
        "export_page",
        "snapshot",
        "restore",
    }
)


class ProcessEdgeIndex:
    """``EdgeIndex(path, wait_s=..., command=..., layout=...)`` in a child process (see module docstring)."""

    def __init__(self, path: Path, *, wait_s: float = 600.0, command: str | None = None,
                 layout: EdgeLayout | None = None, build_quiet_s: float = 0.0,
                 build_max_pending: int = 0, trace_file: Path | None = None) -> None:
        self._path = Path(path)
        # The lease names the bot's command, not the worker's ("evident serve (index worker)").
        self._spec = (
            str(self._path),
            wait_s,
            command or f"{describe_process()} (index worker)",
            layout or EdgeLayout(),
        )
        self._lock = asyncio.Lock()  # requests in order; the pipe carries one at a time
        self._io = threading.Lock()
        self._process: subprocess.Popen[bytes] | None = None
        self._conn: Connection | None = None
        self._open_kwargs: dict[str, Any] | None = None
        self.restarts = 0
        self.trace_file = trace_file
        self.busy: tuple[str, float] | None = None  # the request in the worker now, since (monotonic)
        self.builds = QuietBuilds(lambda: self._request("optimize"), quiet_s=build_quiet_s,
                                  max_pending=build_max_pending)

    @property
    def path(self) -> Path:
        return self._path

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    # ------------------------------------------------------------------ Index

    async def open(self, *, dense_dim: int, embedder: str, recipe: Mapping[str, Any] | None = None) -> None:
        kwargs = {"dense_dim": dense_dim, "embedder": embedder, "recipe": dict(recipe) if recipe else None}
        await self._request("open", (), kwargs)
        self._open_kwargs = kwargs
        if self.builds.quiet_s > 0:  # what an earlier process left unbuilt (cheap when nothing is)
            await self.builds.request()

    async def close(self) -> None:
        """Close the index and stop the child (idempotent); a build still waiting for quiet is dropped."""
        await self.builds.cancel()
        async with self._lock:
            self._open_kwargs = None
            await asyncio.to_thread(self._stop)

    async def drop(self) -> None:
        await self.builds.cancel()
        await self._request("drop")
        self._open_kwargs = None
        async with self._lock:
            await asyncio.to_thread(self._stop)

    async def optimize(self) -> bool:
        """Build now, or once no request has come for ``build_quiet_s`` (then False; see ``QuietBuilds``)."""
        return bool(await self.builds.request())

    async def replace_page(self, page_id: str, page_hash: str, points: Sequence[IndexPoint]) -> None:
        await self._request("replace_page", (page_id, page_hash, list(points)))
        self.builds.written(len(points))

    async def delete_pages(self, page_ids: Sequence[str]) -> None:
        await self._request("delete_pages", (list(page_ids),))
        self.builds.written(len(page_ids))  # deleted points are vacuumed by a build too

    async def search(self, request: SearchRequest) -> list[Hit]:
        hits: list[Hit] = await self._request("search", (request,))
        return hits

    async def search_many(self, requests: Sequence[SearchRequest]) -> list[list[Hit]]:
        """One round trip: a question's searches never wait behind a sync's writes one by one."""
        if not requests:
            return []
        found: list[list[Hit]] = await self._request("search_many", (list(requests),))
        return found

    async def page_hashes(self) -> dict[str, str]:
        return dict(await self._request("page_hashes"))

    async def page_spaces(self) -> dict[str, str]:
        return dict(await self._request("page_spaces"))

    async def set_access(self, pages: Mapping[str, PageAccess | None]) -> None:
        await self._request("set_access", (dict(pages),))

    async def get(self, evidence_ids: Sequence[str], scope: AccessScope) -> list[Evidence]:
        found: list[Evidence] = await self._request("get", (list(evidence_ids), scope))
        return found

    async def recipe(self) -> dict[str, Any] | None:
        """The recipe the index's manifest records, read from its file (the child wrote it at ``open``)."""
        return await asyncio.to_thread(read_recipe, self._path)

    async def count(self) -> int:
        return int(await self._request("count"))

    async def missing_access(self) -> int:
        return int(await self._request("missing_access"))

    async def stats(self) -> dict[str, object]:
        return dict(await self._request("stats"))

    async def snapshot(self, dest: Path) -> dict[str, object]:
        return dict(await self._request("snapshot", (dest,)))

    async def restore(self, src: Path, *, force: bool = False) -> None:
        await self._request("restore", (src,), {"force": force})

    async def ready(self) -> None:
        """A count, unless the worker is busy writing or building segments (the count would only queue behind
        it); raises when that has lasted over ``MAINTENANCE_GRACE_S``."""
        busy = self.busy
        if busy is not None and busy[0] in MAINTENANCE_OPS:
            if time.monotonic() - busy[1] > MAINTENANCE_GRACE_S:
                raise IndexError_(
                    f"the index worker has been in {busy[0]} for over {MAINTENANCE_GRACE_S:.0f} s"
                )
            return
        await self.count()

    async def export_points(
        self, batch: int = 256, *, page_ids: Sequence[str] | None = None
    ) -> AsyncIterator[IndexPoint]:
        """Every live point (of ``page_ids``), a page per request; see ``EdgeIndex.export_points``."""
        pages = sorted(await self.page_hashes()) if page_ids is None else list(page_ids)
        for page_id in pages:
            for point in await self._request("export_page", (page_id, batch)):
                yield point

    # ------------------------------------------------------------------ plumbing

    async def _request(
        self, op: str, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        question = op in QUESTION_OPS
        asked = time.monotonic()
        if question:
            self.builds.begin()
        try:
            async with self._lock:
                if self._conn is None and op != "open" and self._open_kwargs is not None:
                    await self._round_trip(("open", (), self._open_kwargs))  # a new child after a crash
                    self.restarts += 1
                self.busy = (op, time.monotonic())
                try:
                    reply = await self._round_trip((op, args, kwargs or {}), self.busy[1] - asked)
                finally:
                    self.busy = None
        finally:
            if question:
                self.builds.end()
        if reply[0] == "error":
            raise _error(reply[1], reply[2])
        return reply[1]

    async def _round_trip(self, message: tuple[str, tuple[Any, ...], dict[str, Any]],
                          queued_s: float = 0.0) -> Any:
        """Send and receive in a worker thread; a cancelled caller still waits, keeping the pipe in step."""
        task = asyncio.ensure_future(asyncio.to_thread(self._exchange, message, queued_s))
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            await asyncio.wait([task])
            raise

    def _exchange(self, message: tuple[str, tuple[Any, ...], dict[str, Any]], queued_s: float = 0.0) -> Any:
        with self._io:
            if self._conn is None:
                self._start()
            conn = self._conn
            assert conn is not None
            try:
                sent = time.monotonic()
                conn.send(message)
                reply = conn.recv()
                if self.trace_file is not None:
                    self._trace(self.trace_file,
                                trace_line(message[0], sent, queued_s, time.monotonic() - sent, reply))
                return reply
            except (EOFError, OSError):
                code = self._process.poll() if self._process is not None else None
                self._stop()
                raise IndexError_(f"the index worker for {self._path} died (exit code {code}) during "
                                  f"{message[0]}; the next call starts a new one") from None

    def _trace(self, path: Path, line: str) -> None:
        """Append to the trace file (this runs in the request's thread); a write that fails turns it off."""
        try:
            with open(path, "a", encoding="utf-8") as out:
                out.write(line + "\n")
        except OSError as exc:
            log.warning("index trace off: cannot write %s: %s", path, exc)
            self.trace_file = None

    def _start(self) -> None:
        self._process, self._conn = spawn_child("pipeline.index.edge_worker")
        self._conn.send(self._spec)

    def _stop(self) -> None:
        conn, process, self._conn, self._process = self._conn, self._process, None, None
        stop_child(conn, process, ("close", (), {}), reply_s=60, exit_s=30)  # closing flushes the shard


MAINTENANCE_OPS = frozenset({"optimize", "replace_page", "delete_pages"})
# what answering a question asks of the index: these postpone a deferred build (readiness counts do not)
QUESTION_OPS = frozenset({"search", "search_many", "get"})
MAINTENANCE_GRACE_S = 1800.0


def trace_line(op: str, sent: float, queued_s: float, round_trip_s: float, reply: tuple[Any, ...]) -> str:
    """A request as the trace file records it: when it was sent (serve's monotonic clock), the ms it queued
    in serve behind other requests, the round trip (pickling, the pipe, the worker), and the worker's own
    execution and CPU ms (absent for a failed request)."""
    ms = {"queued_ms": queued_s, "round_trip_ms": round_trip_s}
    if reply[0] == "ok" and len(reply) >= 4:
        ms |= {"exec_ms": reply[2], "cpu_ms": reply[3]}
    return json.dumps({"op": op, "sent": round(sent, 4), **{k: round(v * 1000, 2) for k, v in ms.items()}})


def _error(kind: str, message: str) -> EvidentError:
    """The child's error as the same class here (any evident error; anything else an index error)."""
    cls = getattr(errors, kind, None)
    if isinstance(cls, type) and issubclass(cls, EvidentError):
        return cls(message)
    return IndexError_(message)


async def _handle(index: Any, op: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    if op == "export_page":
        page_id, batch = args
        return [p async for p in index.export_points(batch, page_ids=[page_id])]
    return await getattr(index, op)(*args, **kwargs)


def _serve(conn: Connection) -> None:  # pragma: no cover - runs in the child
    """The child: one ``EdgeIndex``, answering requests until told to close or the parent goes away."""
    import signal

    from pipeline.index.edge import EdgeIndex

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C and SIGTERM are the parent's; it closes us
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    path, wait_s, command, layout = conn.recv()
    index = EdgeIndex(Path(path), wait_s=wait_s, command=command, layout=layout)
    loop = asyncio.new_event_loop()
    try:
        while True:
            try:
                op, args, kwargs = conn.recv()
            except (EOFError, OSError):
                break
            if op not in _OPS:
                conn.send(("error", "IndexError_", f"unknown index operation {op!r}"))
                continue
            try:
                started, cpu = time.monotonic(), time.process_time()
                result = loop.run_until_complete(_handle(index, op, args, kwargs))
                conn.send(("ok", result, time.monotonic() - started, time.process_time() - cpu))
            except EvidentError as exc:
                conn.send(("error", type(exc).__name__, str(exc)))
            except Exception as exc:  # noqa: BLE001 - one failed call; the worker lives on
                conn.send(("error", "IndexError_", f"{type(exc).__name__}: {exc}"))
            if op in ("close", "drop"):
                break
    finally:
        with contextlib.suppress(Exception):
            loop.run_until_complete(index.close())
        loop.close()


if __name__ == "__main__":  # pragma: no cover - the child process
    _serve(Connection(int(sys.argv[1])))
