"""The SQLite store, on real files in a temp dir."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest

from pipeline.errors import InputError, StoreError
from pipeline.store import Store
from pipeline.store.migrations import MIGRATIONS
from pipeline.turns import RetrievedRef, TurnRecord
from pipeline.types import Citation


@pytest.fixture
async def store(tmp_path: Path):
    s = await Store.open(tmp_path / "nested" / "evident.db")
    yield s
    await s.close()


async def test_schema_is_versioned_and_wal(tmp_path: Path) -> None:
    s = Store(tmp_path / "a.db")
    assert s.schema_version == len(MIGRATIONS)
    await s.close()
    conn = sqlite3.connect(tmp_path / "a.db")
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS)
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert {"conversations", "turns", "feedback", "attributions", "sync_state", "seen_events"} <= tables
    conn.close()


async def test_version_1_store_keeps_its_answer_links(tmp_path: Path) -> None:
    """A store written by v0.1 (column ``slack_ts``, dict meta) opens, migrates and still finds the answer a
    reaction points at."""
    path = tmp_path / "v1.db"
    conn = sqlite3.connect(path)
    import sqlite_utils

    MIGRATIONS[0](sqlite_utils.Database(conn))
    conn.execute("PRAGMA user_version=1")
    conn.execute(
        "INSERT INTO conversations(key, created_at, updated_at, meta) VALUES ('T1:C1:1.0', 'x', 'x', '{}')"
    )
    conn.execute(
        "INSERT INTO turns(conversation_key, turn_no, created_at, question, answer, retrieved, slack_ts, "
        "meta) "
        "VALUES ('T1:C1:1.0', 1, 'x', 'q', 'a [1]', ?, '9.9', ?)",
        (
            '[{"evidence_id": "e1", "score": 0.1, "rank": 1, "page_id": "p", "url": "u", "title": "t"}]',
            '{"raw_answer": "a [1] raw", "notice": null}',
        ),
    )
    conn.commit()
    conn.close()
    s = Store(path)
    turn = await s.turn_by_message("C1", "9.9")
    assert turn is not None and turn.message_ref == "9.9" and turn.raw_answer == "a [1] raw"
    assert turn.retrieved == (RetrievedRef("e1", 0.1, 1, "p", "u", "t"),)
    assert s.schema_version == len(MIGRATIONS) == 7
    await s.close()


async def test_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "future.db"
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version={len(MIGRATIONS) + 1}")
    conn.close()
    with pytest.raises(StoreError, match="newer"):
        Store(path)


async def test_turns_roundtrip_history_and_restart(tmp_path: Path) -> None:
    path = tmp_path / "evident.db"
    s = Store(path)
    key = "T1:C1:1700000000.000100"
    assert not await s.conversation_exists(key)
    retrieved = (RetrievedRef("e1", score=0.5, rank=1, page_id="p1", url="u", title="t"),)
    cited = (Citation(1, "u", "t", "ENG", ("e1",)),)
    ids = []
    for i in range(11):
        ids.append(await s.add_turn(TurnRecord(conversation_key=key, question=f"q{i}", user_id="U1",
                                               retrieved=retrieved, timings={"retrieve": 12.5},
                                               out_of_scope=False, notice="shortened")))
    ids.append(
        await s.add_turn(
            TurnRecord(
                conversation_key=key,
                question="q11",
                user_id="U1",
                retrieved=retrieved,
                timings={"retrieve": 12.5},
                out_of_scope=False,
                notice="shortened",
                answer="because [1]",
                citations=cited,
                raw_answer="because [1] raw",
                extractive=True,
                model="extractive",
                prompt_template="answer",
                prompt_version="1",
            )
        )
    )
    assert await s.conversation_exists(key)
    hist = await s.history(key, limit=3)
    assert [t.question for t in hist] == ["q9", "q10", "q11"]
    assert [t.turn_no for t in hist] == [10, 11, 12]
    await s.set_feedback(ids[0], "U2", 1, platform="slack")
    await s.put_attribution(ids[0], "cfa", "h1", {"scores": [0.7, 0.3]})
    await s.set_checkpoint("confluence", "ENG", "2024-01-01T00:00:00Z")
    await s.close()
    with pytest.raises(StoreError, match="closed"):
        await s.get_turn(ids[0])

    s2 = Store(path)
    t = await s2.get_turn(ids[-1])
    assert t is not None
    assert t.answer == "because [1]" and t.citations == cited
    assert t.retrieved == retrieved and t.timings == {"retrieve": 12.5}
    assert t.extractive is True and t.out_of_scope is False
    assert t.raw_answer == "because [1] raw" and t.notice == "shortened"  # kept in the meta column
    assert await s2.get_feedback(ids[0]) == {"U2": 1}
    assert await s2.get_attribution(ids[0], "cfa", "h1") == {"scores": [0.7, 0.3]}
    assert await s2.get_checkpoint("confluence", "ENG") == "2024-01-01T00:00:00Z"
    assert len(await s2.history(key, limit=100)) == 12
    assert await s2.add_turn(TurnRecord(conversation_key=key, question="after restart")) > ids[-1]
    await s2.close()


async def test_linking_a_missing_turn_fails_and_an_empty_key_is_refused(store: Store) -> None:
    tid = await store.add_turn(TurnRecord(conversation_key="cli:s", question="q"))
    with pytest.raises(StoreError, match="does not exist"):
        await store.set_message_ref(tid + 100, "1.2")
    with pytest.raises(StoreError, match="does not exist"):
        await store.mark_explained(tid + 100)
    assert await store.get_turn(tid + 100) is None
    with pytest.raises(InputError):
        await store.add_turn(TurnRecord(conversation_key="", question="q"))


async def test_turn_by_message_matches_key_or_channel_prefix(store: Store) -> None:
    a = await store.add_turn(TurnRecord(conversation_key="T1:C1:100.1", question="q"))
    # '_' must not act as a LIKE wildcard
    b = await store.add_turn(TurnRecord(conversation_key="T1:C1_x:200.2", question="q"))
    await store.set_message_ref(a, "555.5")
    await store.set_message_ref(b, "555.5")
    assert (await store.turn_by_message("T1:C1:100.1", "555.5")).id == a  # type: ignore[union-attr]
    assert (await store.turn_by_message("T1:C1", "555.5")).id == a  # type: ignore[union-attr]
    assert (await store.turn_by_message("T1:C1_x", "555.5")).id == b  # type: ignore[union-attr]
    # bare channel id, as reactions give it
    assert (await store.turn_by_message("C1", "555.5")).id == a
    assert (await store.turn_by_message("C1_x", "555.5")).id == b  # type: ignore[union-attr]
    assert await store.turn_by_message("T1:C1", "999.9") is None
    assert await store.turn_by_message("T1:C", "555.5") is None
    assert await store.turn_by_message("C", "555.5") is None
    assert await store.turn_by_message("C1%", "555.5") is None


async def test_feedback_change_and_remove(store: Store) -> None:
    tid = await store.add_turn(TurnRecord(conversation_key="cli:s", question="q"))
    await store.set_feedback(tid, "U1", 1, platform="slack")
    await store.set_feedback(tid, "U2", -1, platform="slack")
    await store.set_feedback(tid, "U1", -1, platform="slack")
    assert await store.get_feedback(tid) == {"U1": -1, "U2": -1}
    await store.remove_feedback(tid, "U1")
    assert await store.get_feedback(tid) == {"U2": -1}
    await store.remove_feedback(tid, "nobody")
    with pytest.raises(InputError):
        await store.set_feedback(tid, "U1", 0, platform="slack")
    with pytest.raises(StoreError):  # foreign key: no such turn
        await store.set_feedback(tid + 50, "U1", 1, platform="slack")


async def test_feedback_records_platform_and_keeps_a_comment(tmp_path: Path) -> None:
    s = Store(tmp_path / "f.db")
    tid = await s.add_turn(TurnRecord(conversation_key="teams:t:19:c", question="q"))
    await s.set_feedback(tid, "U1", -1, platform="teams", comment="wrong page")
    await s.set_feedback(tid, "U1", -1, platform="teams")  # a later reaction keeps the comment
    await s.close()
    conn = sqlite3.connect(tmp_path / "f.db")
    assert conn.execute("SELECT value, platform, comment FROM feedback").fetchall() == [
        (-1, "teams", "wrong page")
    ]
    conn.close()


async def test_sync_runs_keep_the_latest_with_their_first_failures(store: Store) -> None:
    assert await store.last_sync() is None
    for i in range(4):
        await store.record_sync(
            "confluence", f"run {i}", [(f"page:{n}", "bad table") for n in range(i * 10)], keep=3
        )
    last = await store.last_sync()
    assert last is not None and last.summary == "run 3" and last.failed == 30
    assert len(last.errors) == 20 and last.errors[0] == "page:0: bad table"
    rows = await store._run(lambda: store._rows("SELECT COUNT(*) AS n FROM sync_runs"))
    assert rows[0]["n"] == 3


async def test_attribution_cache_upserts(store: Store) -> None:
    tid = await store.add_turn(TurnRecord(conversation_key="cli:s", question="q"))
    assert await store.get_attribution(tid, "cfa", "p") is None
    await store.put_attribution(tid, "cfa", "p", [1, 2])
    await store.put_attribution(tid, "cfa", "p", [3])
    await store.put_attribution(tid, "naive", "p", [4])
    assert await store.get_attribution(tid, "cfa", "p") == [3]
    assert await store.get_attribution(tid, "naive", "p") == [4]


async def test_checkpoints(store: Store) -> None:
    assert await store.get_checkpoint("confluence", "ENG") is None
    await store.set_checkpoint("confluence", "ENG", "2024-01-01T00:00:00Z")
    await store.set_checkpoint("confluence", "ENG", "2024-02-01T00:00:00Z")
    await store.set_checkpoint("confluence", "HR", "2023-01-01T00:00:00Z")
    assert await store.get_checkpoint("confluence", "ENG") == "2024-02-01T00:00:00Z"
    assert await store.get_checkpoint("confluence", "HR") == "2023-01-01T00:00:00Z"


async def test_seen_events_dedup_and_prune(tmp_path: Path) -> None:
    s = Store(tmp_path / "e.db", seen_events_ttl_s=0.2)
    results = await asyncio.gather(*(s.mark_event_seen("Ev1") for _ in range(20)))
    assert sorted(results) == [False] * 19 + [True]
    assert await s.mark_event_seen("Ev2") is True
    await asyncio.sleep(0.3)
    assert await s.mark_event_seen("Ev1") is True  # pruned after the TTL, so a new event again
    await s.close()


async def test_fifty_concurrent_writers(tmp_path: Path) -> None:
    path = tmp_path / "c.db"
    s = Store(path)
    other = Store(path)  # a second connection, like a CLI beside the bot

    async def writer(i: int) -> int:
        store = s if i % 2 else other
        tid = await store.add_turn(
            TurnRecord(
                conversation_key=f"cli:{i % 5}",
                question=f"q{i}",
                user_id=f"U{i}",
                answer=f"a{i}",
                timings={"total": i},
            )
        )
        await store.set_message_ref(tid, f"{i}.0")
        await store.set_feedback(tid, f"U{i}", 1 if i % 3 else -1, platform="teams")
        return tid

    ids = await asyncio.wait_for(asyncio.gather(*(writer(i) for i in range(50))), timeout=30)
    assert len(set(ids)) == 50
    for k in range(5):
        hist = await s.history(f"cli:{k}", limit=100)
        assert [t.turn_no for t in hist] == list(range(1, 11))
        assert all(t.answer == "a" + t.question[1:] for t in hist)
    await s.close()
    await other.close()
