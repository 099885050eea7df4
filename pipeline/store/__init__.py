"""The SQLite store, by concern: turns, conversation meta, feedback, the attribution cache, connector state,
handled events, local sources, the people directory and page permissions, and the reports status views read
(one module each, all over one ``Database``).
``Store`` is all of them; callers depend on the small protocols of ``pipeline.protocols``."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from pipeline.store.attributions import Attributions
from pipeline.store.conversations import ConversationMeta
from pipeline.store.directory import StoreDirectory
from pipeline.store.events import EventLog
from pipeline.store.feedback import Feedback
from pipeline.store.reports import StoreReports
from pipeline.store.sources import StoreSources
from pipeline.store.sync_state import SyncState
from pipeline.store.turns import Turns

__all__ = ["Store"]


class Store(Turns, ConversationMeta, Feedback, Attributions, SyncState, EventLog, StoreReports, StoreSources,
            StoreDirectory):
    """Async facade over one SQLite file. Safe to share across tasks; call ``close()`` at shutdown."""

    @classmethod
    async def open(cls, path: Path, **kwargs: Any) -> Store:
        """Construct (connect + migrate) in a worker thread, for callers already on the event loop."""
        return await asyncio.to_thread(cls, path, **kwargs)
