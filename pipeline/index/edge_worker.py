"""The embedded index in its own process, so Qdrant Edge never holds the bot's GIL.

Qdrant Edge keeps the GIL for the whole of each call: building the HNSW graph of a 100k-point segment
froze every thread of the calling process for seconds (``asyncio.to_thread`` does not help), and
loading a large shard for hundreds of milliseconds. ``ProcessEdgeIndex`` is the ``Index`` that an
``EdgeIndex(path, ...)`` would be, running in a child process (``pipeline.index.edge_worker_child``); the
bot's process only pickles requests and results. ``evident serve`` uses it by default
(``EVIDENT_INDEX_PROCESS=auto``).

- Writes and every other request go one at a time, in order; a question's requests (``QUESTION_OPS``) go
  at once beside them (``pipeline.runtime.request_pipe``): the child answers each request as its own task,
  so a search waits for one step of a page's write, not the whole of it. An optimize still delays the
  searches behind it (Qdrant Edge holds the child's GIL), never the event loop; with ``build_quiet_s`` it
  waits for a quiet moment (``QuietBuilds``).
- The child holds the directory's lease like any evident process, so CLI commands still get the index
  handed over between operations.
- A crash of the child fails the calls in flight with ``IndexError_``; the next call starts a new child
  and opens the index again with the same arguments.
- ``export_points`` moves one page per request.
- ``trace_file`` (``EVIDENT_INDEX_TRACE_FILE``): a JSON line per request, for finding what a slow search
  waited for (``trace_line``; its CPU time is the child's, with whatever ran beside the request).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import subprocess
import time
from collections.abc import AsyncIterator, Awaitable, Mapping, Sequence
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
from pipeline.runtime.request_pipe import Message, RequestPipe
from pipeline.types import Evidence, Hit, IndexPoint, SearchRequest

log = logging.getLogger("evident.index")

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
        self._lock = asyncio.Lock()  # every request but a question's: one at a time, in order
        self._starting = asyncio.Lock()  # one (re)start of the child at a time
        self._process: subprocess.Popen[bytes] | None = None
        self._pipe: RequestPipe | None = None
        self._open_kwargs: dict[str, Any] | None = None
        self._closed = False  # by close() or drop(): no new child until open()
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

    @property
    def worker_alive(self) -> bool:
        """Whether a child is running and its connection open (False after it died: the next call starts
        one)."""
        return self._pipe is not None and self._pipe.alive

    # ------------------------------------------------------------------ Index

    async def open(self, *, dense_dim: int, embedder: str, recipe: Mapping[str, Any] | None = None) -> None:
        kwargs = {"dense_dim": dense_dim, "embedder": embedder, "recipe": dict(recipe) if recipe else None}
        self._closed = False
        await self._request("open", (), kwargs)
        self._open_kwargs = kwargs
        if self.builds.quiet_s > 0:  # what an earlier process left unbuilt (cheap when nothing is)
            await self.builds.request()

    async def close(self) -> None:
        """Close the index and stop the child (idempotent); a build still waiting for quiet is dropped."""
        await self.builds.cancel()
        async with self._lock:
            self._open_kwargs, self._closed = None, True
            await self._stop()

    async def drop(self) -> None:
        await self.builds.cancel()
        await self._request("drop")
        self._open_kwargs, self._closed = None, True
        async with self._lock:
            await self._stop()

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
        message = (op, args, kwargs or {})
        if op in QUESTION_OPS:  # beside whatever else is in flight
            self.builds.begin()
            try:
                reply = await self._call(message)
            finally:
                self.builds.end()
        else:
            asked = time.monotonic()
            async with self._lock:
                self.busy = (op, time.monotonic())
                try:  # a cancelled caller still waits: the next request is sent once this one is done
                    reply = await _finished(self._call(message, self.busy[1] - asked))
                finally:
                    self.busy = None
        if reply[0] == "error":
            raise _error(reply[1], reply[2])
        return reply[1]

    async def _call(self, message: Message, queued_s: float = 0.0) -> Any:
        return await (await self._running(message[0])).call(message, queued_s)

    async def _running(self, op: str) -> RequestPipe:
        """The child's pipe; after a crash, a new child with the index opened again (``_start``)."""
        async with self._starting:
            if self._pipe is not None and self._pipe.alive:
                return self._pipe
            if self._closed and op != "open":
                raise IndexError_(f"index at {self._path} is not open; call open() first")
            await self._stop_child()
            return await _finished(self._start(op))  # a cancelled caller neither orphans nor undoes a start

    async def _start(self, op: str) -> RequestPipe:
        """A new child, its spec sent and (unless ``op`` is the open) the index opened again; when a step
        fails the child is stopped (or left to the next ``_stop_child``): the next call tries again."""
        process, conn = await asyncio.to_thread(spawn_child, "pipeline.index.edge_worker_child")
        self._process = process
        try:
            await asyncio.to_thread(conn.send, self._spec)
        except BaseException:
            conn.close()
            raise
        pipe = self._pipe = RequestPipe(conn, lambda failed: _died(self._path, failed, process), self._traced)
        if op != "open" and self._open_kwargs is not None:
            try:
                reply = await pipe.call(("open", (), self._open_kwargs))
                if reply[0] == "error":
                    raise _error(reply[1], reply[2])
            except BaseException:
                await self._stop_child()
                raise
            self.restarts += 1
        return pipe

    def _traced(self, op: str, sent: float, queued_s: float, round_trip_s: float, reply: Any) -> None:
        """Append to the trace file (in the pipe's reader thread); a write that fails turns it off."""
        path = self.trace_file
        if path is None:
            return
        try:
            with open(path, "a", encoding="utf-8") as out:
                out.write(trace_line(op, sent, queued_s, round_trip_s, reply) + "\n")
        except OSError as exc:
            log.warning("index trace off: cannot write %s: %s", path, exc)
            self.trace_file = None

    async def _stop(self) -> None:
        async with self._starting:
            await self._stop_child()

    async def _stop_child(self) -> None:
        """Close the child's index (it finishes what is in flight first; closing flushes the shard), then
        stop it."""
        pipe, process, self._pipe, self._process = self._pipe, self._process, None, None
        try:
            if pipe is not None and pipe.alive:
                with contextlib.suppress(EvidentError, TimeoutError):  # died meanwhile, or hangs: see below
                    async with asyncio.timeout(60):
                        await pipe.call(("close", (), {}))
        finally:  # also when cancelled: the child is stopped and its threads end
            await asyncio.shield(asyncio.to_thread(_reap, pipe, process))


def _died(path: Path, op: str, process: subprocess.Popen[bytes]) -> IndexError_:
    return IndexError_(f"the index worker for {path} died (exit code {process.poll()}) during {op}; the next "
                       f"call starts a new one")


def _reap(pipe: RequestPipe | None, process: subprocess.Popen[bytes] | None) -> None:
    stop_child(None, process, None, exit_s=30)
    if pipe is not None:
        pipe.close()


async def _finished(call: Awaitable[Any]) -> Any:
    """``call``'s result; when the caller is cancelled, still waits for it before raising (its own failure,
    if any, is read, so it is not logged as never retrieved)."""
    task = asyncio.ensure_future(call)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        await asyncio.wait([task])
        if not task.cancelled():
            task.exception()
        raise


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
