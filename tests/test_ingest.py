"""ingest_pages with the real parser, evidence builder and Edge index (test embedder for speed)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from helpers import HashEmbedder, ingest_folder, ingest_options

from connectors.local import LocalFolderConnector, sample_space_dir
from pipeline.access.scope import EVERYTHING
from pipeline.index.edge import EdgeIndex
from pipeline.ingest.run import ingest_pages, page_to_evidence
from pipeline.models.sparse import Bm25Encoder
from pipeline.types import Page, SearchRequest


async def _sample_pages() -> list[Page]:
    return [p async for p in LocalFolderConnector([sample_space_dir()]).iter_pages()]


async def _lexical(index: EdgeIndex, text: str) -> list[str]:
    req = SearchRequest(
        dense=None, sparse=Bm25Encoder().encode_query(text), mode="lexical", limit=5, scope=EVERYTHING
    )
    return [h.evidence.text for h in await index.search(req)]


async def test_reingest_is_idempotent_without_embedding(tmp_path: Path) -> None:
    index, embedder, first = await ingest_folder(tmp_path / "index")
    try:
        assert (first.added, first.updated, first.unchanged, first.failed) == (10, 0, 0, [])
        assert first.evidence == embedder.documents_embedded == await index.count() == 68
        calls = embedder.document_calls
        second = await ingest_pages(
            await _sample_pages(),
            index=index,
            embedder=embedder,
            sparse=Bm25Encoder(),
            options=ingest_options(),
        )
        assert (second.added, second.updated, second.unchanged, second.failed) == (0, 0, 10, [])
        assert second.evidence == 0 and embedder.document_calls == calls
        assert await index.count() == 68
    finally:
        await index.close()


async def test_changed_options_reindex_everything(tmp_path: Path) -> None:
    """The indexing configuration is part of the page hash: changing it is not 'unchanged'."""
    index, embedder, _ = await ingest_folder(tmp_path / "index")
    try:
        report = await ingest_pages(
            await _sample_pages(),
            index=index,
            embedder=embedder,
            sparse=Bm25Encoder(),
            options=ingest_options(table_indexing="rows"),
        )
        assert report.updated == 10 and report.unchanged == 0
        assert "table" not in report.evidence_by_kind and await index.count() == report.evidence
    finally:
        await index.close()


async def test_changed_page_is_replaced_as_a_unit(tmp_path: Path) -> None:
    index, embedder, _ = await ingest_folder(tmp_path / "index")
    try:
        pages = await _sample_pages()
        old = next(p for p in pages if p.id == "100002")
        old_ids = {ev.id for ev in page_to_evidence(old, ingest_options())}
        body = old.body.replace("Prepare the evaluation todo list", "Write the quarterly zeppelin report")
        new = dataclasses.replace(old, body=body)
        new_evidence = page_to_evidence(new, ingest_options())
        before = embedder.documents_embedded
        report = await ingest_pages([*pages[:1], new], index=index, embedder=embedder, sparse=Bm25Encoder(),
                                    options=ingest_options())
        assert (report.updated, report.unchanged, report.added) == (1, 1, 0)
        assert embedder.documents_embedded - before == len(new_evidence)  # only the changed page
        assert await index.count() == 68
        live = await index.get([ev.id for ev in new_evidence], scope=EVERYTHING)
        assert len(live) == len(new_evidence)
        gone = old_ids - {ev.id for ev in new_evidence}
        assert gone and await index.get(sorted(gone), scope=EVERYTHING) == []
        assert any("zeppelin" in t for t in await _lexical(index, "quarterly zeppelin report"))
        assert not any(
            "Prepare the evaluation todo list" in t for t in await _lexical(index, "evaluation todo list")
        )
        hashes = await index.page_hashes()
        assert len(hashes) == 10
    finally:
        await index.close()


async def test_failing_pages_are_reported_and_the_rest_indexed(tmp_path: Path) -> None:
    pages = await _sample_pages()
    base = pages[0]
    bad = [
        dataclasses.replace(base, id="bad-empty", body="   "),
        dataclasses.replace(base, id="bad-notext", body="<p> </p><ac:structured-macro ac:name='toc'/>"),
        dataclasses.replace(base, id="bad-huge", body="<p>" + "x " * 2_200_000 + "</p>"),
    ]
    embedder = HashEmbedder()
    index = EdgeIndex(tmp_path / "index")
    await index.open(dense_dim=embedder.dim, embedder=embedder.name)
    try:
        report = await ingest_pages(
            [bad[0], *pages[:5], bad[1], *pages[5:], bad[2]],
            index=index,
            embedder=embedder,
            sparse=Bm25Encoder(),
            options=ingest_options(),
        )
        assert report.pages_seen == 13 and report.added == 10
        reasons = dict(report.failed)
        assert set(reasons) == {"bad-empty", "bad-notext", "bad-huge"}
        assert "no content" in reasons["bad-empty"] and "no text content" in reasons["bad-notext"]
        assert "too large" in reasons["bad-huge"]
        assert set(await index.page_hashes()) == {p.id for p in pages}
    finally:
        await index.close()


async def test_small_batches_write_every_page(tmp_path: Path) -> None:
    """Evidence of several pages is embedded per batch; a tiny batch size must not lose or mix pages."""
    index, embedder, report = await ingest_folder(
        tmp_path / "index", options=ingest_options(batch_evidence=5)
    )
    try:
        assert report.added == 10 and await index.count() == 68
        assert embedder.document_calls > 1 and embedder.documents_embedded == 68
    finally:
        await index.close()


@pytest.mark.confquestions
async def test_twenty_confquestions_pages(confq_dir: Path, tmp_path: Path) -> None:
    files = sorted((confq_dir / "documents").glob("*.json"))[:20]
    assert len(files) == 20
    embedder = HashEmbedder()
    index = EdgeIndex(tmp_path / "index")
    await index.open(dense_dim=embedder.dim, embedder=embedder.name)
    connector = LocalFolderConnector(files)
    try:
        report = await ingest_pages(
            connector.iter_pages(),
            index=index,
            embedder=embedder,
            sparse=Bm25Encoder(),
            options=ingest_options(),
        )
        assert connector.failures == []
        assert report.pages_seen >= 20
        assert report.added + len(report.failed) == report.pages_seen and report.added >= 18
        assert report.evidence == await index.count() > 100
        assert set(report.evidence_by_kind) <= {"passage", "list", "table", "row"}
        again = await ingest_pages(
            connector.iter_pages(),
            index=index,
            embedder=embedder,
            sparse=Bm25Encoder(),
            options=ingest_options(),
        )
        assert again.unchanged == report.added
    finally:
        await index.close()


async def test_an_index_built_before_permissions_gets_them_at_the_next_ingest(tmp_path: Path) -> None:
    index, embedder, _ = await ingest_folder(tmp_path / "index")
    try:
        pages = await index.page_hashes()
        await index.set_access(dict.fromkeys(pages))  # as an index written before permissions existed
        assert await index.missing_access() == 68
        again = await ingest_pages(
            await _sample_pages(),
            index=index,
            embedder=embedder,
            sparse=Bm25Encoder(),
            options=ingest_options(),
        )
        assert again.unchanged == 10 and again.evidence == 0  # nothing re-embedded ...
        assert await index.missing_access() == 0  # ... and every page readable by anyone (a local folder)
    finally:
        await index.close()
