"""A watch on the event loop: every time it is blocked for longer than a threshold, one warning naming where.

A probe from outside (``GET /healthz`` every 50 ms) sees a slow answer but not why: the loop may have run
a blocking call, a long stretch of pure Python, a garbage collection, or simply not been scheduled on a busy
machine. ``LoopWatch`` runs a heartbeat on the loop and a thread beside it; when the heartbeat is late by
half of ``threshold_s`` the thread takes the loop thread's stack at that moment, and when the loop runs
again after more than ``threshold_s`` the heartbeat logs

    event loop blocked 133 ms at slack/handler.py:88 in _post < ...

(the innermost frames, each file as its last two path parts; no locals, so no page text or secrets). A block
with no stack taken (inside a call that keeps the GIL, so the thread cannot run) is logged without one. A
garbage collection keeps the GIL too, in whichever thread ran it: the watch times every collection
(``gc.callbacks``) and names the collections of a block when they took a quarter of it or more (``during
garbage collection: generation 2, 96 ms``; a block that allocates a lot runs many short ones).
``stalls`` counts the blocks.

The heartbeat runs every tenth of the threshold (at least 5 ms), and lateness is counted from when it was due,
so every block longer than 1.1x the threshold is reported, and none shorter than the threshold.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import sys
import threading
import time
import traceback
from collections.abc import AsyncIterator, Callable
from types import FrameType

log = logging.getLogger("evident.loop")

_FRAMES = 4  # innermost frames named in a warning
MIN_INTERVAL_S = 0.005  # the heartbeat's period is a tenth of the threshold, not below this


def freeze_start_up() -> int:
    """Move every object start-up made (modules, models, settings, clients) out of the garbage collector's
    scans, and return how many: a full collection then walks only what serving made since. Over the ~150,000
    objects serve's imports alone leave, one full collection took 37–57 ms on a busy 2-core machine, and a
    collection holds the GIL, so the event loop waits for it."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def where(frame: FrameType | None) -> str:
    """The innermost frames of a stack as ``path:line in function``, innermost first, ``<`` between."""
    if frame is None:
        return ""
    stack = traceback.extract_stack(frame)[-_FRAMES:]
    return " < ".join(f"{_short(f.filename)}:{f.lineno} in {f.name}" for f in reversed(stack))


def _short(path: str) -> str:
    """A file as its last two path parts (``asyncio/events.py``, ``answer/engine.py``)."""
    return "/".join(path.replace("\\", "/").split("/")[-2:])


class LoopWatch:
    """Warns on every block of the running loop over ``threshold_s`` (see module docstring)."""

    def __init__(self, threshold_s: float, on_block: Callable[[], object] | None = None) -> None:
        self.threshold_s = threshold_s
        self.on_block = on_block
        self.interval_s = max(MIN_INTERVAL_S, threshold_s / 10)
        self.stalls = 0
        self.longest_s = 0.0
        self._due = 0.0  # when the heartbeat should next run (monotonic)
        self._stack: tuple[float, str] | None = None  # (the due time it was taken for, where)
        self._stop = threading.Event()
        self._collecting: float | None = None  # when the collection in progress began
        # written by the gc callback only (any thread): time in collections and collections per generation;
        # the heartbeat keeps their values at its last beat
        self._gc_s, self._gc_runs = 0.0, [0, 0, 0]
        self._gc_base: tuple[float, list[int]] = (0.0, [0, 0, 0])

    @contextlib.asynccontextmanager
    async def watching(self) -> AsyncIterator[LoopWatch]:
        loop_thread = threading.get_ident()
        self._due = time.monotonic() + self.interval_s
        beat = asyncio.create_task(self._heartbeat())
        thread = threading.Thread(target=self._watch, args=(loop_thread,), name="loop-watch", daemon=True)
        thread.start()
        gc.callbacks.append(self._on_gc)
        try:
            yield self
        finally:
            with contextlib.suppress(ValueError):
                gc.callbacks.remove(self._on_gc)
            self._stop.set()
            beat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beat
            await asyncio.to_thread(thread.join, 5)

    async def _heartbeat(self) -> None:
        while True:
            await asyncio.sleep(max(0.0, self._due - time.monotonic()))
            late = time.monotonic() - self._due
            if late > self.threshold_s:
                self._report(late)
            self._due = time.monotonic() + self.interval_s
            self._gc_base = (self._gc_s, list(self._gc_runs))

    def _report(self, late: float) -> None:
        self.stalls += 1
        if self.on_block is not None:
            self.on_block()
        self.longest_s = max(self.longest_s, late)
        taken = self._stack
        at = f" at {taken[1]}" if taken is not None and taken[0] == self._due and taken[1] else ""
        log.warning("event loop blocked %d ms%s%s", round(late * 1000), at, self._collected(late))

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._collecting = time.monotonic()
        elif self._collecting is not None:
            self._gc_s += time.monotonic() - self._collecting
            self._gc_runs[min(2, max(0, info.get("generation", 0)))] += 1
            self._collecting = None

    def _collected(self, late: float) -> str:
        """The block's collections as a suffix for the warning, when they took a quarter of it or more."""
        base_s, base_runs = self._gc_base
        spent = self._gc_s - base_s
        if spent < late / 4:
            return ""
        oldest = max((g for g in range(3) if self._gc_runs[g] > base_runs[g]), default=0)
        return f" during garbage collection: generation {oldest}, {round(spent * 1000)} ms"

    def _watch(self, loop_thread: int) -> None:
        """The thread: once the heartbeat is overdue by half the threshold, the loop's stack (one callback
        runs the whole block, so a block just over the threshold still has its frame)."""
        while not self._stop.wait(self.interval_s):
            due = self._due
            overdue = time.monotonic() - due > self.threshold_s / 2
            if overdue and (self._stack is None or self._stack[0] != due):
                self._stack = (due, where(sys._current_frames().get(loop_thread)))
