"""The engine under per-user access scopes: answers, memory and explanations never reach readers who may not
read the evidence (the sample index with permissions written onto it, as a permission sync does)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest
from helpers import (  # noqa: F401 - the fixture
    RAG_MEETING_URL,
    EngineParts,
    make_engine,
    open_copy,
    sample_index_fixture,
)

from pipeline.access.scope import AccessScope, page_access, user
from pipeline.types import Hit

RAG_PAGE = "100002"
QUESTION = "What is Alice's todo from the RAG meeting in October?"
ALICE = AccessScope.for_readers([frozenset({user("alice")})], None, "alice")
BOB = AccessScope.for_readers([frozenset({user("bob")})], None, "bob")


@pytest.fixture
async def parts(sample_index_template: Path, tmp_path: Path) -> AsyncIterator[EngineParts]:
    index, embedder = await open_copy(sample_index_template, tmp_path / "index")
    pages = await index.page_hashes()
    await index.set_access({pid: () for pid in pages})  # every page readable by anyone ...
    await index.set_access({RAG_PAGE: page_access([[user("alice")]])})  # ... but the meeting notes
    p = make_engine(index, embedder, tmp_path / "evident.db")
    yield p
    await p.close()


async def test_an_answer_uses_only_what_its_reader_may_read(parts: EngineParts) -> None:
    mine = await parts.engine.ask("dm:alice", QUESTION, scope=ALICE)
    assert mine.answer.citations and mine.answer.citations[0].url == RAG_MEETING_URL
    theirs = await parts.engine.ask("dm:bob", QUESTION, scope=BOB)
    assert RAG_MEETING_URL not in {c.url for c in theirs.answer.citations}
    assert all(h.evidence.page_id != RAG_PAGE for h in theirs.answer.evidence)
    assert "Prepare the evaluation todo list" not in theirs.answer.text


async def test_memory_does_not_carry_evidence_to_another_audience(parts: EngineParts) -> None:
    first = await parts.engine.ask("thread:1", QUESTION, scope=ALICE)
    assert first.answer.citations[0].url == RAG_MEETING_URL
    follow = await parts.engine.ask("thread:1", "And Bruno?", scope=BOB)  # Bob follows up in the thread
    assert not follow.is_followup  # Alice's turn is not his memory: it showed him nothing he may read
    assert follow.retrieval is not None and "RAG meeting" not in follow.retrieval.query
    own = await parts.engine.ask("thread:1", "And Bruno?", scope=ALICE)
    assert own.is_followup and own.retrieval is not None and "RAG meeting" in own.retrieval.query


async def test_an_explanation_is_given_only_where_all_its_evidence_may_be_read(parts: EngineParts) -> None:
    turn = await parts.engine.ask("thread:2", QUESTION, scope=ALICE)
    hidden = await parts.engine.explain(turn.turn_id, scope=BOB)
    assert hidden.error == "not visible" and hidden.result is None
    assert "Prepare the evaluation" not in hidden.text
    shown = await parts.engine.explain(turn.turn_id, scope=ALICE)
    assert shown.error is None and shown.result is not None
    cached = await parts.engine.explain(turn.turn_id, scope=BOB)  # the cache is checked after visibility
    assert cached.error == "not visible"


async def test_serve_tells_the_operator_about_evidence_without_permissions(
        parts: EngineParts, caplog: pytest.LogCaptureFixture) -> None:
    from evident.serve import warn_unpermitted
    from evident.settings import Settings

    assert await warn_unpermitted(Settings.load(env={}), parts.engine.index) == 0  # space mode: not asked
    await parts.engine.index.set_access({"100001": None})  # one page's permissions unknown
    missing = await warn_unpermitted(Settings.load(env={}, access="per-user"), parts.engine.index)
    assert missing > 0 and f"{missing} indexed evidence carry no permissions" in caplog.text


async def test_the_pages_shown_as_read_are_only_pages_the_reader_may_read(parts: EngineParts) -> None:
    """What a surface shows while answering (Slack's "Read n pages" card, Teams' informative update) comes
    from the same scoped retrieval as the answer."""
    async def pages_shown(who: str, scope: AccessScope) -> list[str]:
        shown: list[str] = []

        async def sink(hits: Sequence[Hit]) -> None:
            shown.extend(h.evidence.page_id for h in hits)

        await parts.engine.ask(f"dm:{who}:read", QUESTION, scope=scope, on_retrieved=sink)
        return shown

    assert RAG_PAGE in await pages_shown("alice", ALICE)
    bobs = await pages_shown("bob", BOB)
    assert bobs and RAG_PAGE not in bobs
