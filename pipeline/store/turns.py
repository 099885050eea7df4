"""Turns: each question of a conversation with what answered it, and the platform message that shows it."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

from pipeline.errors import InputError, StoreError
from pipeline.store.database import Database, like_escape, now_iso
from pipeline.turns import RetrievedRef, Turn, TurnRecord, citation_from_json, citation_to_json

# TurnRecord fields kept in the ``meta`` JSON column rather than a column of their own.
_META_FIELDS = frozenset({"raw_answer", "notice", "explained_answer"})
_BOOL_FIELDS = frozenset({"out_of_scope", "extractive"})


class Turns(Database):
    async def conversation_exists(self, key: str) -> bool:
        def q() -> bool:
            return self._db.execute("SELECT 1 FROM conversations WHERE key=?", (key,)).fetchone() is not None

        return await self._run(q)

    async def add_turn(self, record: TurnRecord) -> int:
        """Append a turn (creating the conversation if new) and return its id; turn_no counts from 1."""
        key = record.conversation_key
        if not key:
            raise InputError("conversation_key must not be empty")
        values = _encode({f.name: getattr(record, f.name) for f in dataclasses.fields(record)
                          if f.name != "conversation_key"})

        def q() -> int:
            now = now_iso()
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

    async def _set_column(self, turn_id: int, column: str, value: str) -> None:
        def q() -> None:
            with self._tx() as conn:
                if conn.execute(f"UPDATE turns SET {column}=? WHERE id=?", (value, turn_id)).rowcount == 0:
                    raise StoreError(f"turn {turn_id} does not exist")

        await self._run(q)

    async def set_message_ref(self, turn_id: int, message_ref: str) -> None:
        """Link a turn to the platform message that shows its answer (for reactions on it)."""
        await self._set_column(turn_id, "message_ref", message_ref)

    async def mark_explained(self, turn_id: int) -> None:
        """Record that the turn's explanation was posted (later requests, even after a restart, are
        ignored)."""
        await self._set_column(turn_id, "explained_at", now_iso())

    async def get_turn(self, turn_id: int) -> Turn | None:
        rows = await self._run(lambda: self._rows("SELECT * FROM turns WHERE id=?", (turn_id,)))
        return decode_turn(rows[0]) if rows else None

    async def latest_turn_id(self, conversation_prefix: str = "") -> int | None:
        """The newest turn (optionally within conversations whose key starts with the prefix)."""
        esc = like_escape(conversation_prefix)
        rows = await self._run(
            lambda: self._rows(
                "SELECT id FROM turns WHERE conversation_key LIKE ? ESCAPE '\\' ORDER BY id DESC LIMIT 1",
                (esc + "%",),
            )
        )
        return int(rows[0]["id"]) if rows else None

    async def history(self, conversation_key: str, limit: int = 10) -> list[Turn]:
        """The last ``limit`` turns of a conversation, oldest first."""
        rows = await self._run(lambda: self._rows(
            "SELECT * FROM turns WHERE conversation_key=? ORDER BY turn_no DESC LIMIT ?",
            (conversation_key, int(limit))))
        return [decode_turn(r) for r in reversed(rows)]

    async def turn_by_message(self, key_or_channel: str, message_ref: str) -> Turn | None:
        """The turn whose posted answer is message ``message_ref``. A reaction event names only the channel
        and the message, not the thread, so ``key_or_channel`` may be a full conversation key, a key prefix
        (``team:channel`` matches ``team:channel:<thread_ts>``) or a bare channel id (the middle segment)."""
        esc = like_escape(key_or_channel)

        def q() -> list[dict[str, Any]]:
            return self._rows(
                "SELECT * FROM turns WHERE message_ref=? AND (conversation_key=? "
                "OR conversation_key LIKE ? ESCAPE '\\' OR conversation_key LIKE ? ESCAPE '\\') "
                "ORDER BY id DESC LIMIT 1",
                (message_ref, key_or_channel, esc + ":%", "%:" + esc + ":%"),
            )

        rows = await self._run(q)
        return decode_turn(rows[0]) if rows else None


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


def decode_turn(row: dict[str, Any]) -> Turn:
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
        explained_answer=meta.get("explained_answer") or "",
        message_ref=row.get("message_ref"), explained_at=row.get("explained_at"),
    )
