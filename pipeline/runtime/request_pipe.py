"""Requests to a worker process over one connection, several in flight at once.

A worker that answered one request at a time made a question's search wait for the whole of a sync's page
write in front of it (serve's index worker: up to 53 ms queued, p90 38 ms, during a 50,000-page sync's edits;
BENCHMARKS.md). Each request now carries an id; the worker answers each as its own task, so a search is
answered between the steps of a write, and its reply may overtake the write's. ``multiprocessing``'s
``Connection`` carries the messages; it has no ids or dispatch of its own, hence this small layer.

- One sender thread pickles and sends the requests in the order ``call`` was called (a page's points are a
  large message: never on the loop); a request that cannot be pickled fails alone.
- One reader thread takes every reply off the connection and hands it to the loop that waits for it.
- When the connection ends (the worker died or was stopped), every request in flight fails with the error
  ``died(op)`` makes, and ``alive`` turns False: the owner starts a new worker for the next request.
- A caller that is cancelled leaves its request to finish in the worker; the reply is dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

log = logging.getLogger(__name__)

Message = tuple[str, tuple[Any, ...], dict[str, Any]]  # (operation, args, kwargs)
Trace = Callable[[str, float, float, float, Any], None]  # (op, sent, queued_s, round_trip_s, reply)


@dataclass
class _Waiting:
    future: asyncio.Future[Any]
    loop: asyncio.AbstractEventLoop
    op: str
    queued_s: float  # the caller's own wait before ``call``; the sender's queue is added when it is sent
    enqueued: float = 0.0
    sent: float = 0.0


class RequestPipe:
    """The parent's end: ``await call(message)`` is the worker's reply to it (see the module docstring)."""

    def __init__(self, conn: Connection, died: Callable[[str], Exception],
                 trace: Trace | None = None) -> None:
        self._conn = conn
        self._died = died
        self._trace = trace
        self._state = threading.Lock()
        self._waiting: dict[int, _Waiting] = {}
        self._ids = itertools.count()
        self.alive = True
        self._outbox: queue.SimpleQueue[tuple[int, Message, _Waiting] | None] = queue.SimpleQueue()
        self._sender = threading.Thread(target=self._send, daemon=True, name="worker-requests")
        self._reader = threading.Thread(target=self._read, daemon=True, name="worker-replies")
        self._sender.start()
        self._reader.start()

    async def call(self, message: Message, queued_s: float = 0.0) -> Any:
        loop = asyncio.get_running_loop()
        rid = next(self._ids)
        waiting = _Waiting(loop.create_future(), loop, message[0], queued_s, time.monotonic())
        with self._state:
            if not self.alive:
                raise self._died(message[0])
            self._waiting[rid] = waiting
        self._outbox.put((rid, message, waiting))
        return await waiting.future

    def _send(self) -> None:
        """The sender thread, until ``close``."""
        while (item := self._outbox.get()) is not None:
            rid, message, waiting = item
            waiting.sent = time.monotonic()
            waiting.queued_s += waiting.sent - waiting.enqueued  # behind other requests' sending
            try:
                self._conn.send((rid, *message))
            except OSError:  # the connection broke: the next call starts a new worker
                with self._state:
                    self.alive = False
                error: Exception = self._died(message[0])
            except Exception as exc:  # noqa: BLE001 - not picklable: nothing was sent, this request fails
                error = TypeError(f"{message[0]} could not be sent to the worker: {exc}")
            else:
                continue
            with self._state:
                found = self._waiting.pop(rid, None)
            if found is not None:
                _settle(found, None, error)

    def _read(self) -> None:
        """The reader thread: replies to their callers until the connection ends, then fails the rest."""
        try:
            while True:
                try:
                    rid, reply = self._conn.recv()
                except Exception:  # noqa: BLE001 - ended, broken or garbled: the worker is taken for dead
                    return
                with self._state:
                    waiting = self._waiting.pop(rid, None)
                if waiting is not None:
                    self._traced(waiting, reply)
                    _settle(waiting, reply, None)
        finally:
            with self._state:
                self.alive = False
                left, self._waiting = self._waiting, {}
            for waiting in left.values():
                _settle(waiting, None, self._died(waiting.op))

    def _traced(self, waiting: _Waiting, reply: Any) -> None:
        if self._trace is None:
            return
        try:
            self._trace(waiting.op, waiting.sent, waiting.queued_s, time.monotonic() - waiting.sent, reply)
        except Exception:  # a diagnostic must not end the replies
            log.exception("worker trace failed for %s", waiting.op)

    def close(self, wait_s: float = 5.0) -> None:
        """Once the worker has exited (its end of the connection closed): stop sending and reading, close
        ours."""
        self._outbox.put(None)
        self._sender.join(wait_s)
        self._reader.join(wait_s)
        self._conn.close()


def _settle(waiting: _Waiting, reply: Any, error: Exception | None) -> None:
    def settle() -> None:
        if waiting.future.done():  # the caller was cancelled
            return
        if error is not None:
            waiting.future.set_exception(error)
        else:
            waiting.future.set_result(reply)

    with contextlib.suppress(RuntimeError):  # the caller's loop is closed: nobody waits any more
        waiting.loop.call_soon_threadsafe(settle)
