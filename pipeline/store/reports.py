"""Read-only reports over the store, for an operator's or a user's view of evident (Slack's App Home).

A mixin of ``pipeline.store.Store``: it uses the store's connection helpers and runs nothing but SELECTs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, TypeVar

from pipeline.store.database import Database

T = TypeVar("T")


@dataclass(frozen=True)
class RatedTurn:
    turn_id: int
    conversation_key: str
    question: str
    message_ref: str | None
    up: int
    down: int


@dataclass(frozen=True)
class FeedbackSummary:
    up: int
    down: int
    worst: tuple[RatedTurn, ...]  # most 👎 first


@dataclass(frozen=True)
class SpaceSync:
    source: str
    space: str
    checkpoint_utc: str
    updated_at: str


@dataclass(frozen=True)
class SyncRun:
    source: str
    finished_at: str
    summary: str
    failed: int
    errors: tuple[str, ...]


class StoreReports(Database):
    """What status views (App Home, `evident status`) read: popular pages, recent questions, feedback,
    syncs."""

    async def popular_pages(self, limit: int = 20, *,
                            recent_turns: int = 2000) -> list[tuple[str, str, int, str]]:
        """(title, space, times cited, an evidence id it was cited for) of the pages the latest
        ``recent_turns`` answers cited most. The evidence id lets callers check who may see the page."""
        rows = await self._run(lambda: self._rows(
            "SELECT json_extract(c.value, '$.title') AS title, json_extract(c.value, '$.space') AS space, "
            "COUNT(*) AS n, MAX(json_extract(c.value, '$.evidence_ids[0]')) AS evidence FROM "
            "(SELECT citations FROM turns WHERE error IS NULL AND json_valid(citations) "
            "ORDER BY id DESC LIMIT ?) AS t, json_each(t.citations) AS c "
            "GROUP BY title, space ORDER BY n DESC, title LIMIT ?", (int(recent_turns), int(limit))))
        return [(str(r["title"] or ""), str(r["space"] or ""), int(r["n"]), str(r["evidence"] or ""))
                for r in rows if r["title"]]

    async def recent_questions(self, user_id: str, limit: int = 5) -> list[tuple[int, str, str]]:
        """(turn id, question, created_at) of one user's latest questions, newest first."""
        rows = await self._run(lambda: self._rows(
            "SELECT id, question, created_at FROM turns WHERE user_id=? AND question != '' "
            "ORDER BY id DESC LIMIT ?", (user_id, int(limit))))
        return [(int(r["id"]), str(r["question"]), str(r["created_at"])) for r in rows]

    async def feedback_summary(self, worst: int = 5) -> FeedbackSummary:
        """All 👍/👎 counted, and the answers with the most 👎."""
        def q() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
            totals = self._rows("SELECT SUM(value > 0) AS up, SUM(value < 0) AS down FROM feedback")
            rated = self._rows(
                "SELECT t.id, t.conversation_key, t.question, t.message_ref, SUM(f.value > 0) AS up, "
                "SUM(f.value < 0) AS down FROM feedback f JOIN turns t ON t.id = f.turn_id GROUP BY t.id "
                "HAVING down > 0 ORDER BY down DESC, up ASC, t.id DESC LIMIT ?", (int(worst),))
            return totals, rated

        totals, rated = await self._run(q)
        return FeedbackSummary(
            up=int(totals[0]["up"] or 0), down=int(totals[0]["down"] or 0),
            worst=tuple(RatedTurn(int(r["id"]), str(r["conversation_key"]), str(r["question"] or ""),
                                  r["message_ref"], int(r["up"] or 0), int(r["down"] or 0)) for r in rated))

    async def sync_status(self) -> list[SpaceSync]:
        """Each synced space's checkpoint and when it last advanced."""
        rows = await self._run(
            lambda: self._rows(
                "SELECT source, space, checkpoint_utc, updated_at FROM sync_state WHERE space NOT LIKE "
                "'\\_\\_%' ESCAPE '\\' "
                "ORDER BY space"
            )
        )  # rows named __x__ are the connector's own notes (e.g. the CQL zone)
        return [SpaceSync(str(r["source"]), str(r["space"]), str(r["checkpoint_utc"]), str(r["updated_at"]))
                for r in rows]

    async def last_sync(self) -> SyncRun | None:
        """The latest finished sync run, with its first failures."""
        rows = await self._run(lambda: self._rows(
            "SELECT source, finished_at, summary, failed, errors FROM sync_runs ORDER BY id DESC LIMIT 1"))
        if not rows:
            return None
        r = rows[0]
        errors = json.loads(r["errors"] or "[]")
        return SyncRun(str(r["source"]), str(r["finished_at"]), str(r["summary"]), int(r["failed"] or 0),
                       tuple(str(e) for e in errors) if isinstance(errors, list) else ())

