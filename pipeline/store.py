"""The SQLite conversation store: turns, feedback, attribution cache, sync checkpoints, Slack de-dup.

One file, WAL mode and a ``busy_timeout`` so the bot and a CLI can share it. The async API runs every
statement in a worker thread (``asyncio.to_thread``) over one connection guarded by a lock, so many
tasks can write concurrently without blocking the event loop or interleaving transactions.
Schema changes are versioned migrations applied in order and recorded in ``PRAGMA user_version``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import sqlite_utils

from pipeline.errors import InputError, StoreError
from pipeline.store_migrations import MIGRATIONS
from pipeline.store_reports import StoreReports
from pipeline.store_sources import StoreSources
from pipeline.turns import RetrievedRef, Turn, TurnRecord, citation_from_json, citation_to_json

T = TypeVar("T")

# TurnRecord fields kept in the ``meta`` JSON column rather than a column of their own.
_META_FIELDS = frozenset({"raw_answer", "notice"})
_BOOL_FIELDS = frozenset({"out_of_scope", "extractive"})
_UPDATABLE = frozenset(f.name for f in dataclasses.fields(TurnRecord)) - {"conversation_key"}


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


class Store(StoreReports, StoreSources):
    """Async facade over one SQLite file. Safe to share across tasks; call ``close()`` at shutdown."""

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

    @classmethod
    async def open(cls, path: Path, **kwargs: Any) -> Store:
        """Construct (connect + migrate) in a worker thread, for callers already on the event loop."""
        return await asyncio.to_thread(cls, path, **kwargs)

    # ------------------------------------------------------------ plumbing

    def _migrate(self) -> None:
        with self._tx():
            current = int(self._db.execute("PRAGMA user_version").fetchone()[0])
            if current > len(MIGRATIONS):
                raise StoreError(
                    f"store {self.path} has schema version {current}, newer than this evident "
                    f"({len(MIGRATIONS)})"
                )
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

    # ------------------------------------------------------------ conversations & turns

    async def conversation_exists(self, key: str) -> bool:
        def q() -> bool:
            return self._db.execute("SELECT 1 FROM conversations WHERE key=?", (key,)).fetchone() is not None

        return await self._run(q)

    async def add_turn(self, record: TurnRecord) -> int:
        """Append a turn (creating the conversation if new) and return its id; turn_no counts from 1."""
        key = record.conversation_key
        if not key:
            raise InputError("conversation_key must not be empty")
        values = _encode(
            {
                f.name: getattr(record, f.name)
                for f in dataclasses.fields(record)
                if f.name != "conversation_key"
            }
        )

        def q() -> int:
            now = _now()
            with self._tx() as conn:
                conn.execute(
                    "INSERT INTO conversations(key, created_at, updated_at, meta) VALUES (?, ?, ?, '{}') "
                    "ON CONFLICT(key) DO UPDATE SET updated_at=excluded.updated_at",
                    (key, now, now),
                )
                cols = ["conversation_key", "created_at", *values]
                cur = conn.execute(
                    f"INSERT INTO turns({', '.join(cols)}, turn_no) "
                    f"SELECT {', '.join('?' for _ in cols)}, COALESCE(MAX(turn_no), 0) + 1 "
                    "FROM turns WHERE conversation_key=?",
                    (key, now, *values.values(), key),
                )
                assert cur.lastrowid is not None
                return int(cur.lastrowid)

        return await self._run(q)

    async def update_turn(self, turn_id: int, **fields: Any) -> None:
        """Set some of a turn's ``TurnRecord`` fields. Unknown fields or a missing turn raise StoreError."""
        unknown = sorted(set(fields) - _UPDATABLE)
        if unknown:
            raise StoreError(f"unknown turn field(s): {', '.join(unknown)}")
        if not fields:
            return
        values = _encode(fields)
        sets = [f"{c}=json_patch(COALESCE(meta, '{{}}'), ?)" if c == "meta" else f"{c}=?" for c in values]

        def q() -> None:
            with self._tx() as conn:
                cur = conn.execute(
                    f"UPDATE turns SET {', '.join(sets)} WHERE id=?", (*values.values(), turn_id)
                )
                if cur.rowcount == 0:
                    raise StoreError(f"turn {turn_id} does not exist")

        await self._run(q)

    async def set_message_ref(self, turn_id: int, message_ref: str) -> None:
        """Link a turn to the platform message that shows its answer (for reactions on it)."""
        await self.update_turn(turn_id, message_ref=message_ref)

    async def mark_explained(self, turn_id: int) -> None:
        """Record that the turn's explanation was posted (later requests, even after a restart, are
        ignored)."""
        await self.update_turn(turn_id, explained_at=_now())

    async def get_turn(self, turn_id: int) -> Turn | None:
        rows = await self._run(lambda: self._rows("SELECT * FROM turns WHERE id=?", (turn_id,)))
        return _decode_turn(rows[0]) if rows else None

    async def latest_turn_id(self, conversation_prefix: str = "") -> int | None:
        """The newest turn (optionally within conversations whose key starts with the prefix)."""
        esc = _like_escape(conversation_prefix)
        rows = await self._run(lambda: self._rows(
            "SELECT id FROM turns WHERE conversation_key LIKE ? ESCAPE '\\' ORDER BY id DESC LIMIT 1",
            (esc + "%",),
        ))
        return int(rows[0]["id"]) if rows else None

    async def history(self, conversation_key: str, limit: int = 10) -> list[Turn]:
        """The last ``limit`` turns of a conversation, oldest first."""
        rows = await self._run(lambda: self._rows(
            "SELECT * FROM turns WHERE conversation_key=? ORDER BY turn_no DESC LIMIT ?",
            (conversation_key, int(limit)),
        ))
        return [_decode_turn(r) for r in reversed(rows)]

    async def turn_by_message(self, key_or_channel: str, message_ref: str) -> Turn | None:
        """The turn whose posted answer is message ``message_ref``. A reaction event names only the channel
        and the message, not the thread, so ``key_or_channel`` may be a full conversation key, a key prefix
        (``team:channel`` matches ``team:channel:<thread_ts>``) or a bare channel id (the middle segment)."""
        esc = _like_escape(key_or_channel)

        def q() -> list[dict[str, Any]]:
            return self._rows(
                "SELECT * FROM turns WHERE message_ref=? AND (conversation_key=? "
                "OR conversation_key LIKE ? ESCAPE '\\' OR conversation_key LIKE ? ESCAPE '\\') "
                "ORDER BY id DESC LIMIT 1",
                (message_ref, key_or_channel, esc + ":%", "%:" + esc + ":%"),
            )

        rows = await self._run(q)
        return _decode_turn(rows[0]) if rows else None

    async def conversation_meta(self, key: str) -> dict[str, Any]:
        """What a platform keeps about a conversation (e.g. the channel an assistant thread looks at)."""
        rows = await self._run(lambda: self._rows("SELECT meta FROM conversations WHERE key=?", (key,)))
        meta = json.loads(rows[0]["meta"] or "{}") if rows else {}
        return meta if isinstance(meta, dict) else {}

    async def set_conversation_meta(self, key: str, meta: Mapping[str, Any]) -> None:
        payload = json.dumps(dict(meta), ensure_ascii=False)

        def q() -> None:
            now = _now()
            with self._tx() as conn:
                conn.execute(
                    "INSERT INTO conversations(key, created_at, updated_at, meta) VALUES (?, ?, ?, ?) "
                    "ON CONFLICT(key) DO UPDATE SET meta=excluded.meta, updated_at=excluded.updated_at",
                    (key, now, now, payload),
                )

        await self._run(q)

    # ------------------------------------------------------------ feedback

    async def set_feedback(self, turn_id: int, user_id: str, value: int, *, platform: str = "slack",
                           comment: str | None = None) -> None:
        """Record a user's 👍/👎 on a turn (a reaction or a button: one rating per user); a later call changes
        it."""
        if value not in (1, -1):
            raise InputError(f"feedback value must be +1 or -1, got {value!r}")

        def q() -> None:
            with self._tx() as conn:
                conn.execute(
                    "INSERT INTO feedback(turn_id, user_id, value, created_at, platform, comment) "
                    "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT(turn_id, user_id) DO UPDATE SET "
                    "value=excluded.value, "
                    "created_at=excluded.created_at, platform=excluded.platform, "
                    "comment=COALESCE(excluded.comment, feedback.comment)",
                    (turn_id, user_id, value, _now(), platform, comment),
                )

        await self._run(q)

    async def remove_feedback(self, turn_id: int, user_id: str) -> None:
        def q() -> None:
            with self._tx() as conn:
                conn.execute("DELETE FROM feedback WHERE turn_id=? AND user_id=?", (turn_id, user_id))

        await self._run(q)

    async def get_feedback(self, turn_id: int) -> dict[str, int]:
        """user_id -> +1/-1 for one turn."""
        rows = await self._run(
            lambda: self._rows("SELECT user_id, value FROM feedback WHERE turn_id=?", (turn_id,))
        )
        return {r["user_id"]: int(r["value"]) for r in rows}

    # ------------------------------------------------------------ attribution cache

    async def get_attribution(self, turn_id: int, method: str, params_hash: str) -> Any | None:
        rows = await self._run(lambda: self._rows(
            "SELECT result FROM attributions WHERE turn_id=? AND method=? AND params_hash=?",
            (turn_id, method, params_hash),
        ))
        return json.loads(rows[0]["result"]) if rows else None

    async def put_attribution(self, turn_id: int, method: str, params_hash: str, result: Any) -> None:
        payload = json.dumps(result, ensure_ascii=False)

        def q() -> None:
            with self._tx() as conn:
                conn.execute(
                    "INSERT INTO attributions(turn_id, method, params_hash, result, created_at) VALUES (?, "
                    "?, ?, ?, ?) "
                    "ON CONFLICT(turn_id, method, params_hash) DO UPDATE SET result=excluded.result, "
                    "created_at=excluded.created_at",
                    (turn_id, method, params_hash, payload, _now()),
                )

        await self._run(q)

    # ------------------------------------------------------------ connector checkpoints

    async def get_checkpoint(self, source: str, space: str) -> str | None:
        rows = await self._run(lambda: self._rows(
            "SELECT checkpoint_utc FROM sync_state WHERE source=? AND space=?", (source, space)
        ))
        return rows[0]["checkpoint_utc"] if rows else None

    async def set_checkpoint(self, source: str, space: str, checkpoint_utc: str) -> None:
        def q() -> None:
            with self._tx() as conn:
                conn.execute(
                    "INSERT INTO sync_state(source, space, checkpoint_utc, updated_at) VALUES (?, ?, ?, ?) "
                    "ON CONFLICT(source, space) DO UPDATE SET checkpoint_utc=excluded.checkpoint_utc, "
                    "updated_at=excluded.updated_at",
                    (source, space, checkpoint_utc, _now()),
                )

        await self._run(q)

    async def record_sync(
        self, source: str, summary: str, failed: Sequence[tuple[str, str]], *, keep: int = 50
    ) -> None:
        """Remember a finished sync run (its first 20 failures), keeping the latest ``keep`` runs."""
        errors = json.dumps([f"{where}: {why}"[:300] for where, why in failed[:20]], ensure_ascii=False)

        def q() -> None:
            with self._tx() as conn:
                conn.execute(
                    "INSERT INTO sync_runs(source, finished_at, summary, failed, errors) VALUES (?, ?, ?, ?, "
                    "?)",
                    (source, _now(), summary, len(failed), errors),
                )
                conn.execute(
                    "DELETE FROM sync_runs WHERE id NOT IN (SELECT id FROM sync_runs ORDER BY id DESC LIMIT "
                    "?)",
                    (int(keep),),
                )

        await self._run(q)

    # ------------------------------------------------------------ Slack retry de-dup

    async def mark_event_seen(self, event_id: str) -> bool:
        """True the first time an event id is seen (atomic across tasks and processes); prunes old ids."""

        def q() -> bool:
            now = time.time()
            with self._tx() as conn:
                conn.execute("DELETE FROM seen_events WHERE created_at < ?", (now - self._seen_ttl_s,))
                cur = conn.execute(
                    "INSERT OR IGNORE INTO seen_events(event_id, created_at) VALUES (?, ?)", (event_id, now)
                )
                return cur.rowcount == 1

        return await self._run(q)

    # ------------------------------------------------------------ lifecycle

    async def close(self) -> None:
        def q() -> None:
            with self._lock:
                if not self._closed:
                    self._closed = True
                    self._db.close()

        await asyncio.to_thread(q)


# ---------------------------------------------------------------- helpers


def _encode(fields: Mapping[str, Any]) -> dict[str, Any]:
    """``TurnRecord`` field values -> ``turns`` column values (JSON text, 0/1 flags, the ``meta`` object)."""
    out: dict[str, Any] = {}
    meta: dict[str, Any] = {}
    for k, v in fields.items():
        if k in _META_FIELDS:
            meta[k] = v
        elif k == "retrieved":
            out[k] = json.dumps([r.to_json() for r in v], ensure_ascii=False)
        elif k == "citations":
            out[k] = json.dumps([citation_to_json(c) for c in v], ensure_ascii=False)
        elif k == "timings":
            out[k] = json.dumps(dict(v))
        elif k in _BOOL_FIELDS:
            out[k] = int(bool(v))
        else:
            out[k] = v
    if meta:
        out["meta"] = json.dumps(meta, ensure_ascii=False)
    return out


def _decode_turn(row: dict[str, Any]) -> Turn:
    def js(name: str, default: Any) -> Any:
        raw = row.get(name)
        return default if raw is None else json.loads(raw)

    meta = js("meta", {})
    return Turn(
        id=int(row["id"]), turn_no=int(row["turn_no"]), created_at=row["created_at"],
        conversation_key=row["conversation_key"], question=row.get("question") or "",
        user_id=row.get("user_id"), completed_question=row.get("completed_question") or "",
        retrieval_query=row.get("retrieval_query") or "",
        retrieved=tuple(RetrievedRef.from_json(d) for d in js("retrieved", [])),
        answer=row.get("answer") or "",
        citations=tuple(citation_from_json(d) for d in js("citations", [])),
        out_of_scope=bool(row.get("out_of_scope")), extractive=bool(row.get("extractive")),
        model=row.get("model") or "", prompt_template=row.get("prompt_template") or "",
        prompt_version=row.get("prompt_version"), timings=js("timings", {}), error=row.get("error"),
        raw_answer=meta.get("raw_answer") or row.get("answer") or "", notice=meta.get("notice"),
        message_ref=row.get("message_ref"), explained_at=row.get("explained_at"),
    )


def _like_escape(s: str) -> str:
    return s.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
