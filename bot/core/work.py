"""Work done after the platform's acknowledgement: tracked tasks, once per event across restarts, drained on
shutdown.

Chat platforms want an ack within seconds, so adapters only decide *whether* to act and hand the work
here. ``spawn`` keeps every task referenced (an unreferenced task can be garbage-collected mid-flight),
runs it at most once per platform event id even across restarts (``Deduper``), and ``drain`` lets a
graceful shutdown wait for answers still in flight.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

from bot.core.dedup import Deduper
from pipeline.errors import StoreError

log = logging.getLogger("evident.bot")


class BackgroundWork:
    def __init__(self, dedup: Deduper) -> None:
        self.dedup = dedup
        self._tasks: set[asyncio.Task[None]] = set()
        self._closing = False

    @property
    def closing(self) -> bool:
        """A drain has begun: adapters refuse new work (a retryable status) instead of acknowledging it."""
        return self._closing

    def spawn(self, coro: Coroutine[Any, Any, None], name: str,
              event_id: str | None = None) -> asyncio.Task[None] | None:
        """Run ``coro`` after the ack (once per ``event_id`` across restarts); keep the task referenced.
        During a drain nothing new starts (None): adapters check ``closing`` first so the platform
        redelivers."""
        if self._closing:
            coro.close()
            log.warning("shutting down: dropped %s", name)
            return None
        task = asyncio.create_task(self._once(event_id, coro) if event_id else coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _once(self, event_id: str, coro: Coroutine[Any, Any, None]) -> None:
        try:
            first = await self.dedup.first_ever(event_id)
        except StoreError:
            log.exception("event store failed; processing %s anyway", event_id)
            first = True
        if not first:
            coro.close()
            log.info("ignored event %s: an earlier process handled it", event_id)
            return
        await coro

    @property
    def in_flight(self) -> int:
        return len(self._tasks)

    async def drain(self, timeout_s: float = 30.0) -> int:
        """Stop taking work and wait for in-flight answers; returns how many had to be cancelled."""
        self._closing = True
        pending = set(self._tasks)
        if not pending:
            return 0
        _done, still = await asyncio.wait(pending, timeout=timeout_s)
        for t in still:
            t.cancel()
        if still:
            await asyncio.gather(*still, return_exceptions=True)
        return len(still)
