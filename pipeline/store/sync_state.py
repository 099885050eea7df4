"""Where the connectors are: a checkpoint per (source, space), and the latest finished sync runs."""

from __future__ import annotations

import json
from collections.abc import Sequence

from pipeline.store.database import Database, now_iso


class SyncState(Database):
    async def get_checkpoint(self, source: str, space: str) -> str | None:
        rows = await self._run(lambda: self._rows(
            "SELECT checkpoint_utc FROM sync_state WHERE source=? AND space=?", (source, space)))
        return rows[0]["checkpoint_utc"] if rows else None

    async def set_checkpoint(self, source: str, space: str, checkpoint_utc: str) -> None:
        await self._write(
            "INSERT INTO sync_state(source, space, checkpoint_utc, updated_at) VALUES (?, ?, ?, ?) "
            "ON CONFLICT(source, space) DO UPDATE SET checkpoint_utc=excluded.checkpoint_utc, "
            "updated_at=excluded.updated_at",
            (source, space, checkpoint_utc, now_iso()))

    async def record_sync(self, source: str, summary: str, failed: Sequence[tuple[str, str]], *,
                          keep: int = 50) -> None:
        """Remember a finished sync run (its first 20 failures), keeping the latest ``keep`` runs."""
        errors = json.dumps([f"{where}: {why}"[:300] for where, why in failed[:20]], ensure_ascii=False)

        def q() -> None:
            with self._tx() as conn:
                conn.execute("INSERT INTO sync_runs(source, finished_at, summary, failed, errors) "
                             "VALUES (?, ?, ?, ?, ?)", (source, now_iso(), summary, len(failed), errors))
                conn.execute("DELETE FROM sync_runs WHERE id NOT IN "
                             "(SELECT id FROM sync_runs ORDER BY id DESC LIMIT ?)", (int(keep),))

        await self._run(q)
