"""The SQLite file behind the store: one connection, WAL, migrations, and the async plumbing every concern
uses.

One file, WAL mode and a ``busy_timeout`` so the bot and a CLI can share it. The async API runs every
statement in a worker thread (``asyncio.to_thread``) over one connection guarded by a lock, so many tasks can
write concurrently without blocking the event loop or interleaving transactions. Schema changes are versioned
migrations applied in order and recorded in ``PRAGMA user_version``.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import sqlite_utils

from pipeline.errors import StoreError
from pipeline.store.migrations import MIGRATIONS

T = TypeVar("T")


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def like_escape(s: str) -> str:
    return s.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


class Database:
    """The connection and its lock; concerns (turns, feedback, ...) subclass it for
    ``_run``/``_tx``/``_rows``."""

    def __init__(
        self, path: Path, *, busy_timeout_ms: int = 10_000, seen_events_ttl_s: float = 86_400
    ) -> None:
        self.path = Path(path)
        self._seen_ttl_s = seen_events_ttl_s
        self._lock = threading.Lock()
        self._closed = False
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(str(self.path), check_same_thread=False, timeout=busy_timeout_ms / 1000)
            self._db = sqlite_utils.Database(conn)
            self._db.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
            self._db.enable_wal()
            self._db.execute("PRAGMA foreign_keys=ON")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._migrate()
        except (sqlite3.Error, OSError) as exc:
            raise StoreError(f"cannot open store {self.path}: {exc}") from exc

    def _migrate(self) -> None:
        with self._tx():
            current = int(self._db.execute("PRAGMA user_version").fetchone()[0])
            if current > len(MIGRATIONS):
                raise StoreError(f"store {self.path} has schema version {current}, newer than this evident "
                                 f"({len(MIGRATIONS)})")
            for version in range(current, len(MIGRATIONS)):
                MIGRATIONS[version](self._db)
                self._db.conn.execute(f"PRAGMA user_version={version + 1}")

    @property
    def schema_version(self) -> int:
        return int(self._db.execute("PRAGMA user_version").fetchone()[0])

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        """A write transaction taken IMMEDIATE so a second process waits (busy_timeout) instead of
        deadlocking."""
        conn = self._db.conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield conn
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    def _locked(self, fn: Callable[[], T]) -> T:
        with self._lock:
            if self._closed:
                raise StoreError(f"store {self.path} is closed")
            try:
                return fn()
            except sqlite3.Error as exc:
                raise StoreError(f"store {self.path}: {exc}") from exc

    async def _run(self, fn: Callable[[], T]) -> T:
        return await asyncio.to_thread(self._locked, fn)

    def _rows(self, sql: str, params: Any = ()) -> list[dict[str, Any]]:
        cur = self._db.execute(sql, params)
        cols = [d[0] for d in cur.description]
        return [dict(zip(cols, row, strict=True)) for row in cur.fetchall()]

    async def _write(self, sql: str, params: Any = ()) -> None:
        """One statement in its own write transaction."""

        def q() -> None:
            with self._tx() as conn:
                conn.execute(sql, params)

        await self._run(q)

    async def close(self) -> None:
        def q() -> None:
            with self._lock:
                if not self._closed:
                    self._closed = True
                    self._db.close()

        await asyncio.to_thread(q)
