"""``RequestPipe`` against a worker on the other end of a real connection (a thread here)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from multiprocessing import Pipe
from multiprocessing.connection import Connection
from typing import Any

import pytest

from pipeline.runtime.request_pipe import RequestPipe


class Died(Exception):
    pass


def _worker(conn: Connection, hold: threading.Event) -> threading.Thread:
    """Answers ``("echo", (x,), {})`` with ``("ok", x)`` in the order asked, except that ``slow`` waits for
    ``hold``, so a later request's reply overtakes it; ``exit`` closes the connection (a death)."""

    def later(rid: int, value: Any) -> None:
        if hold.wait(10):
            with contextlib.suppress(OSError):
                conn.send((rid, ("ok", value)))

    def run() -> None:
        while True:
            try:
                rid, op, args, _ = conn.recv()
            except (EOFError, OSError):
                return
            if op == "exit":
                conn.close()
                return
            if op == "slow":
                threading.Thread(target=later, args=(rid, args[0]), daemon=True).start()
                continue
            conn.send((rid, ("ok", args[0])))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _pipe(trace: Callable[..., None] | None = None) -> tuple[RequestPipe, threading.Event, Connection]:
    ours, theirs = Pipe()
    hold = threading.Event()
    _worker(theirs, hold)
    return RequestPipe(ours, lambda op: Died(f"died during {op}"), trace), hold, theirs


async def _closed(pipe: RequestPipe) -> None:
    """As ``ProcessEdgeIndex`` ends a worker: it exits (closing its end), then the pipe is closed."""
    if pipe.alive:
        with contextlib.suppress(Died):
            await pipe.call(("exit", (None,), {}))
    pipe.close(wait_s=10)
    assert not pipe._reader.is_alive() and not pipe._sender.is_alive()


async def test_a_later_reply_overtakes_an_earlier_request() -> None:
    pipe, hold, _ = _pipe()
    slow = asyncio.create_task(pipe.call(("slow", ("first",), {})))
    assert await pipe.call(("echo", ("second",), {})) == ("ok", "second")
    assert not slow.done()
    hold.set()
    assert await slow == ("ok", "first")
    await _closed(pipe)


async def test_a_dead_worker_fails_every_request_in_flight_and_every_later_one() -> None:
    pipe, _, _ = _pipe()
    waiting = [asyncio.create_task(pipe.call(("slow", (i,), {}))) for i in range(3)]
    await asyncio.sleep(0.05)
    with pytest.raises(Died, match="during exit"):
        await pipe.call(("exit", (None,), {}))
    for task in waiting:
        with pytest.raises(Died, match="during slow"):
            await task
    assert not pipe.alive
    with pytest.raises(Died, match="during echo"):
        await pipe.call(("echo", (1,), {}))
    await _closed(pipe)


async def test_a_cancelled_request_s_reply_is_dropped_and_the_next_gets_its_own() -> None:
    pipe, hold, _ = _pipe()
    slow = asyncio.create_task(pipe.call(("slow", ("late",), {})))
    await asyncio.sleep(0.05)
    slow.cancel()
    with pytest.raises(asyncio.CancelledError):
        await slow
    hold.set()
    assert await pipe.call(("echo", ("next",), {})) == ("ok", "next")
    await _closed(pipe)


async def test_a_trace_that_raises_never_stops_the_replies(caplog: pytest.LogCaptureFixture) -> None:
    seen: list[str] = []

    def trace(op: str, *_: Any) -> None:
        seen.append(op)
        raise ValueError("trace broke")

    pipe, _, _ = _pipe(trace)
    assert await pipe.call(("echo", (1,), {})) == ("ok", 1)
    assert await pipe.call(("echo", (2,), {})) == ("ok", 2)
    assert seen == ["echo", "echo"] and "worker trace failed" in caplog.text
    await _closed(pipe)


async def test_a_request_that_cannot_be_pickled_fails_alone() -> None:
    pipe, _, _ = _pipe()
    with pytest.raises(TypeError, match="could not be sent"):
        await pipe.call(("echo", (lambda: None,), {}))
    assert await pipe.call(("echo", ("after",), {})) == ("ok", "after")
    await _closed(pipe)


class _SlowToSend:
    """Pickled only once ``go`` is set: the sender thread is held mid-send."""

    def __init__(self, go: threading.Event) -> None:
        self.go = go

    def __reduce__(self) -> tuple[Any, ...]:
        self.go.wait(10)
        return (str, ("sent",))


async def test_the_trace_counts_the_wait_behind_another_requests_sending() -> None:
    """A question behind a page's write in the sender's queue waited there unrecorded (queued 0 ms)."""
    traced: dict[str, float] = {}

    def trace(op: str, sent: float, queued_s: float, *_: Any) -> None:
        traced[op] = queued_s

    pipe, _, _ = _pipe(trace)
    go = threading.Event()
    writing = asyncio.create_task(pipe.call(("echo", (_SlowToSend(go),), {})))
    await asyncio.sleep(0.05)
    asking = asyncio.create_task(pipe.call(("question", ("q",), {})))
    await asyncio.sleep(0.3)
    go.set()
    await writing
    assert await asking == ("ok", "q")
    assert traced["question"] >= 0.25
    await _closed(pipe)
