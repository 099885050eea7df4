"""Questions first: a sync steps aside while a question is retrieved and answered, never for long."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from pathlib import Path

from helpers import HashEmbedder, ingest_options, make_engine, open_copy, sample_index_fixture  # noqa: F401

from connectors.local import LocalFolderConnector, sample_space_dir
from pipeline.access.scope import EVERYTHING
from pipeline.index.edge import EdgeIndex
from pipeline.ingest.run import ingest_pages
from pipeline.models.sparse import Bm25Encoder
from pipeline.runtime.foreground import Foreground
from pipeline.types import Hit, SearchRequest


async def test_step_aside_returns_at_once_when_no_question_is_answered() -> None:
    fg = Foreground()
    start = time.perf_counter()
    await fg.step_aside()
    assert time.perf_counter() - start < 0.05 and fg.paused_s == 0.0


async def test_step_aside_waits_for_the_questions_being_answered() -> None:
    fg = Foreground()
    order: list[str] = []

    async def question() -> None:
        async with fg.answering():
            await asyncio.sleep(0.2)
            order.append("answered")

    task = asyncio.create_task(question())
    await asyncio.sleep(0)
    assert fg.active == 1
    await fg.step_aside()
    order.append("sync step")
    await task
    assert order == ["answered", "sync step"] and fg.active == 0 and fg.paused_s >= 0.15


async def test_a_steady_stream_of_questions_slows_a_sync_but_never_stops_it() -> None:
    fg = Foreground(max_pause_s=0.2)
    async with fg.answering():  # questions without a gap
        start = time.perf_counter()
        await fg.step_aside()
        waited = time.perf_counter() - start
        await fg.step_aside()  # the next steps go on at once for as long as the last one waited
        await fg.step_aside()
        free = time.perf_counter() - start - waited
        await asyncio.sleep(0.25)
        again = time.perf_counter()
        await fg.step_aside()
        waited_again = time.perf_counter() - again
    assert 0.15 <= waited < 1.0 and free < 0.05 and 0.15 <= waited_again < 1.0


async def test_ingest_writes_nothing_while_a_question_is_answered(tmp_path: Path) -> None:
    fg = Foreground(max_pause_s=30)
    embedder = HashEmbedder()
    index = EdgeIndex(tmp_path / "index")
    await index.open(dense_dim=embedder.dim, embedder=embedder.name)
    pages = [p async for p in LocalFolderConnector([sample_space_dir()]).iter_pages()]
    try:
        async with fg.answering():
            sync = asyncio.create_task(ingest_pages(
                pages, index=index, embedder=embedder, sparse=Bm25Encoder(),
                options=ingest_options(batch_evidence=5), step_aside=fg.step_aside))
            await asyncio.sleep(0.3)
            assert not sync.done() and await index.count() == 0 and embedder.document_calls == 0
        report = await asyncio.wait_for(sync, 30)
        assert report.added == len(pages) == 10 and await index.count() == 68 and fg.paused_s > 0
    finally:
        await index.close()


async def test_the_engine_marks_a_questions_retrieval(sample_index_template: Path, tmp_path: Path) -> None:
    index, embedder = await open_copy(sample_index_template, tmp_path / "index")
    parts = make_engine(index, embedder, tmp_path / "evident.db")
    seen: list[int] = []
    search_many = index.search_many

    async def recording(requests: Sequence[SearchRequest]) -> list[list[Hit]]:
        seen.append(parts.engine.foreground.active)
        return await search_many(requests)

    index.search_many = recording  # type: ignore[method-assign]
    try:
        r = await parts.engine.ask("t:fg", "What is Alice's todo from the RAG meeting?", scope=EVERYTHING)
        assert r.error is None and seen == [1] and parts.engine.foreground.active == 0
    finally:
        await parts.close()
