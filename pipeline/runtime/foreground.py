"""Questions first: while a question is retrieved and answered, a sync in the same process steps aside.

On two cores a sync's page parsing, BM25 encoding and index writes take the CPU and the GIL that a question
being answered needs (answers p99 2.0-2.7x idle while ``evident serve``'s sync wrote 500 edited pages of a
50,000-page wiki; BENCHMARKS.md). The engine marks the CPU-bound part of a turn (retrieval, and the extractive
answer) with ``answering()``; the sync awaits ``step_aside()`` between its steps (a page, a batch's encoding,
a page's write), which returns once no question is in that part, or after ``max_pause_s``; a step that waited
that long leaves the next ``max_pause_s`` free of waiting, so under a steady stream of questions a sync still
gets at least half the time. One event loop; no locks.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable

StepAside = Callable[[], Awaitable[None]]  # what a background task awaits between its steps
MAX_PAUSE_S = 2.0  # the longest a sync step waits for questions (a turn's retrieval takes ~0.1 s)


class Foreground:
    """How many questions are in their CPU-bound part now; background steps wait for none."""

    def __init__(self, max_pause_s: float = MAX_PAUSE_S) -> None:
        self.max_pause_s = max_pause_s
        self.paused_s = 0.0  # what background steps have waited, in all
        self._active = 0
        self._free_until = 0.0  # after a wait that ran out: steps go on without waiting until then
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def active(self) -> int:
        return self._active

    @contextlib.asynccontextmanager
    async def answering(self) -> AsyncIterator[None]:
        """Around the CPU-bound part of a turn."""
        self._active += 1
        self._idle.clear()
        try:
            yield
        finally:
            self._active -= 1
            if not self._active:
                self._idle.set()

    async def step_aside(self) -> None:
        """Between a background task's steps: wait while questions are being answered (up to
        ``max_pause_s``)."""
        start = time.monotonic()
        if not self._active or start < self._free_until:
            return
        try:
            async with asyncio.timeout(self.max_pause_s):
                await self._idle.wait()
        except TimeoutError:
            self._free_until = time.monotonic() + self.max_pause_s
        self.paused_s += time.monotonic() - start


async def go_on() -> None:
    """The ``StepAside`` of a task nothing runs beside (``evident sync``, ``evident ingest``)."""
