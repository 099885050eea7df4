"""A serving process's stop: SIGINT/SIGTERM set one event, and start-up work is raced against it.

``stop_on_signals`` is entered first thing in ``evident serve``, so a SIGTERM during model loading, the
start-up credential checks, a wait for Qdrant or the Socket Mode connect loop stops the process within the
configured bound instead of being ignored until start-up finishes (or killing it mid-write).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Awaitable, Iterator
from typing import TypeVar

log = logging.getLogger("evident.bot")

T = TypeVar("T")


@contextlib.contextmanager
def stop_on_signals(stop: asyncio.Event) -> Iterator[None]:
    """Set ``stop`` on SIGINT and SIGTERM while inside (where the loop supports signal handlers)."""
    loop = asyncio.get_running_loop()
    installed: list[signal.Signals] = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(sig, stop.set)
            installed.append(sig)
    try:
        yield
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)


class Stopped(Exception):
    """``stop`` was set before the awaited start-up step finished (the step was cancelled)."""


async def until_stopped(work: Awaitable[T], stop: asyncio.Event, *, what: str = "starting") -> T:
    """Await ``work`` unless ``stop`` is set first: then ``work`` is cancelled and :class:`Stopped` raised."""
    task = asyncio.ensure_future(work)
    waiter = asyncio.ensure_future(stop.wait())
    try:
        done, _ = await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        waiter.cancel()
        raise
    if task in done:
        waiter.cancel()
        return task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task
    log.info("stopped while %s", what)
    raise Stopped(what)


async def sleep_or_stop(seconds: float, stop: asyncio.Event) -> bool:
    """Sleep ``seconds``; True when ``stop`` was set meanwhile (the sleep ends early)."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), timeout=seconds)
    return stop.is_set()
