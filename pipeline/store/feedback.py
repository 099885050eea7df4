"""Feedback: one 👍/👎 per user and turn, from whichever platform it came (with Teams' optional comment)."""

from __future__ import annotations

from pipeline.errors import InputError
from pipeline.store.database import Database, now_iso


class Feedback(Database):
    async def set_feedback(self, turn_id: int, user_id: str, value: int, *, platform: str,
                           comment: str | None = None) -> None:
        """Record a user's 👍/👎 on a turn (a reaction or a button: one rating per user); a later call changes
        it."""
        if value not in (1, -1):
            raise InputError(f"feedback value must be +1 or -1, got {value!r}")
        await self._write(
            "INSERT INTO feedback(turn_id, user_id, value, created_at, platform, comment) "
            "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT(turn_id, user_id) DO UPDATE SET value=excluded.value, "
            "created_at=excluded.created_at, platform=excluded.platform, "
            "comment=COALESCE(excluded.comment, feedback.comment)",
            (turn_id, user_id, value, now_iso(), platform, comment))

    async def remove_feedback(self, turn_id: int, user_id: str) -> None:
        await self._write("DELETE FROM feedback WHERE turn_id=? AND user_id=?", (turn_id, user_id))

    async def get_feedback(self, turn_id: int) -> dict[str, int]:
        """user_id -> +1/-1 for one turn."""
        rows = await self._run(
            lambda: self._rows("SELECT user_id, value FROM feedback WHERE turn_id=?", (turn_id,))
        )
        return {r["user_id"]: int(r["value"]) for r in rows}
