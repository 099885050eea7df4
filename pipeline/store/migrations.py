"""The SQLite store's schema, as versioned migrations applied in order (``PRAGMA user_version``).

Append new migrations; never edit or reorder applied ones: a store written by an older evident opens and is
brought up to date, and a store newer than this evident is refused.
"""

from __future__ import annotations

from collections.abc import Callable

import sqlite_utils


def _m1_initial(db: sqlite_utils.Database) -> None:
    db["conversations"].create(  # type: ignore[union-attr]
        {"key": str, "created_at": str, "updated_at": str, "meta": str}, pk="key", not_null={"created_at"},
    )
    db["turns"].create(  # type: ignore[union-attr]
        {
            "id": int, "conversation_key": str, "turn_no": int, "created_at": str, "user_id": str,
            "question": str, "completed_question": str, "retrieval_query": str, "retrieved": str,
            "answer": str, "citations": str, "out_of_scope": int, "extractive": int, "model": str,
            "prompt_template": str, "prompt_version": str, "timings": str, "error": str, "slack_ts": str,
            "meta": str,
        },
        pk="id", not_null={"conversation_key", "turn_no", "created_at"},
        foreign_keys=[("conversation_key", "conversations", "key")],
    )
    db["turns"].create_index(["conversation_key", "turn_no"], unique=True)  # type: ignore[union-attr]
    db["turns"].create_index(["slack_ts"])  # type: ignore[union-attr]
    db["feedback"].create(  # type: ignore[union-attr]
        {"turn_id": int, "user_id": str, "value": int, "created_at": str},
        pk=("turn_id", "user_id"), foreign_keys=[("turn_id", "turns", "id")],
    )
    db["attributions"].create(  # type: ignore[union-attr]
        {"turn_id": int, "method": str, "params_hash": str, "result": str, "created_at": str},
        pk=("turn_id", "method", "params_hash"), foreign_keys=[("turn_id", "turns", "id")],
    )
    db["sync_state"].create(  # type: ignore[union-attr]
        {"source": str, "space": str, "checkpoint_utc": str, "updated_at": str}, pk=("source", "space"),
    )
    db["seen_events"].create(  # type: ignore[union-attr]
        {"event_id": str, "created_at": float}, pk="event_id")
    db["seen_events"].create_index(["created_at"])  # type: ignore[union-attr]


def _m2_message_ref(db: sqlite_utils.Database) -> None:
    """The posted answer's id is platform-neutral (a Slack ts, a Teams activity id)."""
    db.execute("ALTER TABLE turns RENAME COLUMN slack_ts TO message_ref")


def _m3_feedback_platform(db: sqlite_utils.Database) -> None:
    """Feedback records where it came from (slack, teams) and the comment a feedback form may carry."""
    db.execute("ALTER TABLE feedback ADD COLUMN platform TEXT")
    db.execute("ALTER TABLE feedback ADD COLUMN comment TEXT")


def _m4_explained_at(db: sqlite_utils.Database) -> None:
    """When a turn's explanation was posted: the once-guard survives restarts."""
    db.execute("ALTER TABLE turns ADD COLUMN explained_at TEXT")


def _m5_sync_runs(db: sqlite_utils.Database) -> None:
    """Each finished sync run: what it did and which pages failed (shown to operators in Slack's App Home)."""
    db["sync_runs"].create(  # type: ignore[union-attr]
        {"id": int, "source": str, "finished_at": str, "summary": str, "failed": int, "errors": str}, pk="id")


def _m6_source_pages(db: sqlite_utils.Database) -> None:
    """Which pages each local source folder produced (and from which file): deleted files leave the index."""
    db["source_pages"].create({"source": str, "page_id": str, "file": str},  # type: ignore[union-attr]
                              pk=("source", "page_id"))
    db["source_pages"].create_index(["page_id"])  # type: ignore[union-attr]


def _m7_directory(db: sqlite_utils.Database) -> None:
    """The people a Confluence site knows, as its permission sync saw them: account, e-mail (where the site
    shows it) and group memberships; and each indexed page's permissions fingerprint, to notice changes."""
    db["directory"].create(  # type: ignore[union-attr]
        {"source": str, "account": str, "email": str, "groups": str}, pk=("source", "account"))
    db["directory"].create_index(["email"])  # type: ignore[union-attr]
    db["page_access"].create(  # type: ignore[union-attr]
        {"source": str, "page_id": str, "fingerprint": str}, pk=("source", "page_id"))


# Append new migrations; never edit or reorder applied ones. Index i brings the schema to version i+1.
MIGRATIONS: tuple[Callable[[sqlite_utils.Database], None], ...] = (
    _m1_initial, _m2_message_ref, _m3_feedback_platform, _m4_explained_at, _m5_sync_runs, _m6_source_pages,
    _m7_directory,
)
