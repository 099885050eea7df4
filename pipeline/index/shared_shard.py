"""A Qdrant Edge shard shared between processes: open under the directory's lease, handed over between
operations.

``SharedShard`` owns the lease (``pipeline.index.lease``), the open shard and a watcher thread.
Every index operation runs inside ``use()``, which (re)loads the shard under the lease if it was handed
over and keeps it open until the operation ends; the watcher hands the shard over (flush, close,
release) once another process waits and no operation is in flight. A page swap is one operation, so
nobody ever sees another process's half-written page, and staged leftovers on load can only be a
crashed writer's.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
from collections.abc import AsyncIterator, Callable, Coroutine
from pathlib import Path
from typing import Any, Concatenate, ParamSpec, Protocol, TypeVar

import qdrant_edge as qe

from pipeline.errors import IndexError_
from pipeline.index.lease import IndexLease

T = TypeVar("T")


class SharedShard:
    """The shard of one index directory as this process sees it."""

    def __init__(self, path: Path, *, wait_s: float = 600.0, command: str | None = None) -> None:
        self.path = Path(path)
        self.lease = IndexLease(self.path, command=command, wait_s=wait_s)
        self.lock = threading.RLock()  # every shard call; makes a page swap invisible to readers
        self._shard: qe.EdgeShard | None = None
        self._load: Callable[[], qe.EdgeShard] | None = None
        self._state = threading.Lock()  # guards _shard open/closed and _busy
        self._acquiring = threading.Lock()  # one re-acquire at a time: the lease is not thread-safe
        self._busy = 0  # operations in flight; the shard is never handed over while > 0
        self._opened = False
        self._poke = threading.Event()
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None
        self.handovers = 0

    @property
    def current(self) -> qe.EdgeShard:
        """The open shard (inside ``use()``)."""
        if self._shard is None:
            raise IndexError_(f"index at {self.path} is not open; call open() first")
        return self._shard

    # ------------------------------------------------------------------ lifecycle (blocking: call in a
    # thread)

    def open(self, first: Callable[[], qe.EdgeShard], reload: Callable[[], qe.EdgeShard]) -> None:
        """Take the lease and load the shard with ``first`` (create, check); ``reload`` after hand-overs."""
        if self._opened:
            raise IndexError_(f"index at {self.path} is already open")
        self.lease.acquire()
        try:
            shard = first()
        except BaseException:
            self.lease.release()
            raise
        with self._state:
            self._shard, self._load, self._opened = shard, reload, True
        self._stop.clear()
        self._watcher = threading.Thread(
            target=self._watch, name=f"index-lease:{self.path.name}", daemon=True
        )
        self._watcher.start()

    def close(self) -> None:
        """Flush and close the shard, release the lease (safe to call twice)."""
        self._stop_watcher()
        with self._state:
            self._opened = False
            self._release_locked(yielding=False)

    def remove(self, delete_files: Callable[[], None]) -> None:
        """Close, then ``delete_files`` while still holding the lease (``--rebuild``)."""
        self.lease.acquire()
        try:
            self._stop_watcher()
            with self._state:
                self._opened = False
                self._close_locked()
            delete_files()
        finally:
            self.lease.release()

    def exclusive(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` while holding the lease with the shard flushed and closed (a file-level copy sees a
        consistent directory); the shard is loaded again by the next operation."""
        self.lease.acquire()
        try:
            with self._state:
                self._close_locked()
            return fn()
        finally:
            self.lease.release()

    def release_now(self) -> None:
        """Close the shard and give the lease up at once (a failed first load's cleanup)."""
        with self._state:
            self._release_locked(yielding=False)

    # ------------------------------------------------------------------ operations

    @contextlib.asynccontextmanager
    async def use(self) -> AsyncIterator[qe.EdgeShard]:
        """One operation: the shard is open (waiting for the lease if it was handed over) and stays open."""
        while True:
            with self._state:
                if not self._opened:
                    raise IndexError_(f"index at {self.path} is not open; call open() first")
                if self._shard is not None:
                    self._busy += 1
                    shard = self._shard
                    break
            await asyncio.to_thread(self._reacquire)
        try:
            yield shard
        finally:
            with self._state:
                self._busy -= 1
            self._poke.set()  # the watcher hands over if someone waits

    # ------------------------------------------------------------------ internals

    def _reacquire(self) -> None:
        """Take the lease back and reload the shard. Concurrent operations queue here: the first one
        re-acquires, the others find the lease held (``acquire`` returns at once) and the shard loaded; were
        they to wait on locks of their own, they would wait for their own process."""
        with self._acquiring:
            self.lease.acquire()
            with self._state:
                if self._shard is not None:
                    return
                try:
                    assert self._load is not None
                    self._shard = self._load()
                except BaseException:
                    self._shard = None
                    self.lease.release()
                    raise

    def _watch(self) -> None:
        while not self._stop.is_set():
            self._poke.wait(0.1)
            self._poke.clear()
            with self._state:
                if self._shard is not None and self._busy == 0 and self.lease.others_waiting():
                    self._release_locked(yielding=True)
                    self.handovers += 1

    def _release_locked(self, *, yielding: bool) -> None:
        try:
            self._close_locked()
        finally:
            self.lease.release(yielding=yielding)

    def _close_locked(self) -> None:
        shard, self._shard = self._shard, None
        if shard is not None:
            with self.lock:
                try:
                    shard.flush()
                finally:
                    shard.close()

    def _stop_watcher(self) -> None:
        self._stop.set()
        self._poke.set()
        watcher, self._watcher = self._watcher, None
        if watcher is not None:
            watcher.join()


class HoldsShard(Protocol):
    _shared: SharedShard


S = TypeVar("S", bound=HoldsShard)
P = ParamSpec("P")
R = TypeVar("R")


def in_shard(fn: Callable[Concatenate[S, P], R]) -> Callable[Concatenate[S, P], Coroutine[Any, Any, R]]:
    """A blocking index method as the async one callers use: run in a worker thread while this process holds
    the shard (``SharedShard.use``). Qdrant Edge keeps the GIL within each call; the event loop is not in
    it."""

    @functools.wraps(fn)
    async def run(self: S, *args: P.args, **kwargs: P.kwargs) -> R:
        async with self._shared.use():
            return await asyncio.to_thread(fn, self, *args, **kwargs)

    return run
