"""Retrieval confidence from the rankers' agreement, and the evidence it hands the generator."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from helpers import make_engine, open_copy, sample_index_fixture  # noqa: F401

from pipeline.access.scope import EVERYTHING
from pipeline.answer.confidence import adaptive_hits, confidence_of
from pipeline.answer.retrieve import retrieve
from pipeline.answer.settings import RetrievalSettings
from pipeline.models.sparse import Bm25Encoder
from pipeline.types import Evidence, Hit, SearchRequest


def hit(page: str, rank: int) -> Hit:
    ev = Evidence(id=f"{page}{rank}", page_id=page, title=page, url=f"u/{page}", space="S", kind="passage",
                  position=rank, text="t")
    return Hit(evidence=ev, score=1.0 / rank, rank=rank)


def test_confidence_is_how_many_rankers_put_the_fused_first_page_first() -> None:
    fused = [hit("A", 1), hit("B", 2)]
    assert confidence_of(fused, hit("A", 1), hit("A", 3)) == "high"
    assert confidence_of(fused, hit("A", 1), hit("B", 1)) == "medium"
    assert confidence_of(fused, hit("C", 1), None) == "low"
    assert confidence_of([], hit("A", 1), hit("A", 1)) is None


def test_only_a_sure_retrieval_narrows_the_context() -> None:
    hits = [hit("A", i) for i in range(1, 11)]
    assert len(adaptive_hits(hits, "high", 5)) == 5
    assert len(adaptive_hits(hits, "medium", 5)) == 10 and len(adaptive_hits(hits, "high", 0)) == 10


async def test_the_engine_reports_the_confidence_of_each_turn(
    sample_index_template: Path, tmp_path: Path
) -> None:
    from helpers import options

    index, embedder = await open_copy(sample_index_template, tmp_path / "index")
    parts = make_engine(index, embedder, tmp_path / "evident.db", options=options(confident_k=2))
    try:
        result = await parts.engine.ask(
            "c1", "What is Alice's todo from the RAG meeting in October?", scope=EVERYTHING
        )
        assert result.retrieval is not None and result.retrieval.confidence in ("high", "medium", "low")
        assert result.answer.confidence == result.retrieval.confidence
        assert "confidence_ms" in result.answer.trace.timings_ms
        shown = len(result.answer.evidence)
        assert shown == (2 if result.retrieval.confidence == "high" else len(result.retrieval.hits))
    finally:
        await parts.close()


class _CountingIndex:
    """A real index, its search operations counted (what the embedded worker answers one round trip each)."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.operations = inner, []  # type: ignore[var-annotated]

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def search(self, request: SearchRequest) -> list[Hit]:
        self.operations.append("search")
        return await self.inner.search(request)  # type: ignore[no-any-return]

    async def search_many(self, requests: Sequence[SearchRequest]) -> list[list[Hit]]:
        self.operations.append(f"search_many({len(requests)})")
        return await self.inner.search_many(requests)  # type: ignore[no-any-return]


async def test_a_question_and_its_confidence_are_one_index_operation(
    sample_index_template: Path, tmp_path: Path
) -> None:
    """Each operation may wait behind a sync's write in serve's index worker: one, not three in two rounds."""
    index, embedder = await open_copy(sample_index_template, tmp_path / "index")
    counting = _CountingIndex(index)
    try:
        r = await retrieve("What is Alice's todo from the RAG meeting in October?", scope=EVERYTHING,
                           index=counting, embedder=embedder, sparse=Bm25Encoder(),  # type: ignore[arg-type]
                           config=RetrievalSettings(mode="hybrid", confidence=True))
        assert counting.operations == ["search_many(3)"]
        assert r.hits and r.confidence in ("high", "medium", "low") and len(r.lexical) == len(r.dense) == 1
        counting.operations.clear()
        await retrieve("Alice todo", scope=EVERYTHING, index=counting, embedder=embedder,
                       sparse=Bm25Encoder(),
                       config=RetrievalSettings(mode="hybrid", confidence=False, keep_firsts=False))
        assert counting.operations == ["search"]
        counting.operations.clear()  # each ranker's first is still asked for, to keep it among the evidence
        r = await retrieve("Alice todo", scope=EVERYTHING, index=counting, embedder=embedder,
                           sparse=Bm25Encoder(), config=RetrievalSettings(mode="hybrid", confidence=False))
        assert counting.operations == ["search_many(3)"] and r.confidence is None and len(r.firsts) == 2
    finally:
        await index.close()
