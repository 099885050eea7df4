"""Exactly-once handling of Slack deliveries.

Slack redelivers an event when the ack is slow (``X-Slack-Retry-Num``) and delivers an @mention twice
(``app_mention`` and ``message``). Event ids are checked in memory before the ack (cheap, covers the
common case) and in the store after it, so a retry that reaches a restarted process is still recognised
without putting a disk write in front of Slack's 3-second ack deadline.
"""

from __future__ import annotations

from collections import OrderedDict

from pipeline.protocols import ConversationStore


class SeenSet:
    """A bounded insertion-ordered set: remembers the most recent ``capacity`` keys."""

    def __init__(self, capacity: int = 10_000) -> None:
        self._items: OrderedDict[str, None] = OrderedDict()
        self._capacity = capacity

    def add(self, key: str) -> bool:
        """Add ``key``; True when it was not there yet. Atomic under asyncio (no await)."""
        if key in self._items:
            self._items.move_to_end(key)
            return False
        self._items[key] = None
        if len(self._items) > self._capacity:
            self._items.popitem(last=False)
        return True

    def discard(self, key: str) -> None:
        self._items.pop(key, None)

    def __contains__(self, key: object) -> bool:
        return key in self._items


class Deduper:
    """Event-id and message-level (channel, ts) de-duplication."""

    def __init__(self, store: ConversationStore, capacity: int = 10_000) -> None:
        self._store = store
        self._events = SeenSet(capacity)
        self._messages = SeenSet(capacity)

    def first_in_process(self, event_id: str) -> bool:
        """True for the first delivery of ``event_id`` in this process (no I/O: safe before the ack)."""
        return self._events.add(event_id)

    async def first_ever(self, event_id: str) -> bool:
        """True unless an earlier process already handled ``event_id`` (checked after the ack)."""
        return bool(await self._store.mark_event_seen(event_id))

    async def first_delivery(self, event_id: str) -> bool:
        """Both checks at once."""
        return self.first_in_process(event_id) and await self.first_ever(event_id)

    def claim_message(self, channel: str, ts: str) -> bool:
        """True for the first listener that wants to answer message ``ts`` in ``channel``."""
        return self._messages.add(f"{channel}:{ts}")
