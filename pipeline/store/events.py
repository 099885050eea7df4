"""Platform events already handled: a redelivery (Slack retries, Teams resends) is acted on once, across
processes and restarts."""

from __future__ import annotations

import time

from pipeline.store.database import Database


class EventLog(Database):
    async def mark_event_seen(self, event_id: str) -> bool:
        """True the first time an event id is seen (atomic across tasks and processes); prunes old ids."""

        def q() -> bool:
            now = time.time()
            with self._tx() as conn:
                conn.execute("DELETE FROM seen_events WHERE created_at < ?", (now - self._seen_ttl_s,))
                cur = conn.execute("INSERT OR IGNORE INTO seen_events(event_id, created_at) VALUES (?, ?)",
                                   (event_id, now))
                return cur.rowcount == 1

        return await self._run(q)
