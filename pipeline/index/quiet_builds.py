"""Segment builds moved to a quiet moment, so a serving index answers searches while a sync writes.

Qdrant Edge builds a segment's HNSW graph inside ``optimize()`` and holds its process's GIL throughout;
in serve the index worker answers one request at a time, so every search waits for the whole build. At
50,000 pages (1M evidence) replacing 500 edited pages filled the appendable segment past the indexing
threshold, and the build that followed merged it with the smallest indexed segment: 9.2 s, during which
every question queued (answer p99 during a sync 5.2 s against 0.14 s idle; BENCHMARKS.md, "A 50,000-page
wiki").

Points written but not yet built stay searchable (an appendable segment is searched exhaustively: about
0.25 ms per 1,000 points of 384 dimensions), so the build can wait. ``QuietBuilds`` runs it once no request
has come for ``quiet_s`` seconds, or at once when ``max_pending`` points are waiting (bounding what the
exhaustive search costs). ``quiet_s = 0`` builds at once, as a CLI sync does. A question still waiting for
the worker (behind a sync's page write, on a busy machine) is no quiet moment: the period counts from its
answer, so the build never lands just before the next question of a steady stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

from pipeline.errors import EvidentError

log = logging.getLogger("evident.index")


class QuietBuilds:
    """When ``optimize`` runs: now, or after ``quiet_s`` seconds without a request (see module docstring)."""

    def __init__(self, build: Callable[[], Awaitable[bool]], *, quiet_s: float, max_pending: int) -> None:
        self._build = build
        self.quiet_s = quiet_s
        self.max_pending = max_pending
        self.pending = 0  # points written since the last build
        self.builds = 0  # builds started (at once or deferred)
        self.answering = 0  # questions in flight: never quiet while one is (it may wait for the worker)
        self._last = time.monotonic()
        self._task: asyncio.Task[None] | None = None

    @property
    def scheduled(self) -> bool:
        return self._task is not None and not self._task.done()

    def touch(self) -> None:
        """A request came: the quiet period starts again."""
        self._last = time.monotonic()

    def begin(self) -> None:
        """A request is sent: no build starts before it is answered and ``quiet_s`` have passed."""
        self.answering += 1
        self.touch()

    def end(self) -> None:
        """The request ``begin`` counted is answered (or failed): the quiet period starts from now."""
        self.answering -= 1
        self.touch()

    def written(self, points: int) -> None:
        self.pending += points

    async def request(self) -> bool:
        """An ``optimize`` asked for: run now (returns whether anything was built) or schedule it (False)."""
        if self.quiet_s <= 0 or self.pending >= self.max_pending:
            await self.cancel()
            return await self._run()
        if not self.scheduled:
            self._task = asyncio.get_running_loop().create_task(self._when_quiet())
        return False

    async def cancel(self) -> None:
        """Drop a scheduled build (the next ``optimize`` asks again); waits for one already running."""
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def settled(self) -> None:
        """Wait for the scheduled build, if any, to have run (or failed)."""
        if self._task is not None:
            await asyncio.shield(self._task)

    async def _when_quiet(self) -> None:
        while True:
            wait = self._last + self.quiet_s - time.monotonic()
            if wait <= 0 and not self.answering:
                break
            await asyncio.sleep(wait if wait > 0 else max(self.quiet_s, 0.05))
        try:
            await self._run()
        except EvidentError as exc:
            log.warning("deferred segment build failed: %s (the next sync builds again)", exc)
        except Exception as exc:  # noqa: BLE001 - a background task: nobody else would see it
            log.warning("deferred segment build failed: %s: %s (the next sync builds again)",
                        type(exc).__name__, exc)

    async def _run(self) -> bool:
        pending, self.pending = self.pending, 0
        self.builds += 1
        try:
            return await self._build()
        except BaseException:
            self.pending += pending  # not built: still waiting
            raise
