"""Where pages are prepared: serve's worker process gives what a thread gives, at a lower priority, and a
page its worker dies on or overruns with fails alone."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import pickle
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import HashEmbedder, ingest_options, production_settings

from connectors.local import LocalFolderConnector, sample_space_dir
from pipeline.errors import IndexError_, ParseTimeoutError
from pipeline.index.edge import EdgeIndex
from pipeline.ingest import page_worker
from pipeline.ingest.page_work import PageWork, ThreadPageWork, make_page_work
from pipeline.ingest.page_worker import ProcessPageWork
from pipeline.ingest.run import ingest_pages
from pipeline.ingest.storage import ParseLimits, parse_page
from pipeline.ingest.storage.clock import use_clock
from pipeline.ingest.vocabulary_run import VocabularyRun
from pipeline.models.sparse import Bm25Encoder
from pipeline.types import IndexPoint, Page, SparseVector


async def _pages() -> list[Page]:
    return [p async for p in LocalFolderConnector([sample_space_dir()]).iter_pages()]


def _big_page() -> Page:
    """A page that takes its worker about a second of CPU (12,000 table rows)."""
    rows = "".join(f"<tr><td>member{i} alpha</td><td>task {i} rotates the keys of service {i % 97}</td>"
                   f"<td>{i}</td></tr>" for i in range(12_000))
    body = f"<h1>Big</h1><table><tbody><tr><th>Member</th><th>Task</th><th>N</th></tr>{rows}</tbody></table>"
    return Page("big", "Big", "https://wiki.example/big", "ENG", body)


def _long_page(sections: int) -> Page:
    """A page of many short sections: its parse walks (and checks its deadline) element by element."""
    body = "".join(f"<h2>Part {i}</h2><p>member{i} rotates the keys of service {i % 97} every month.</p>"
                   f"<ul><li>step {i}</li></ul>" for i in range(sections))
    return Page("long", "Long", "https://wiki.example/long", "ENG", body)


async def _warm(work: ProcessPageWork) -> subprocess.Popen[bytes]:
    """The worker started (its first page prepared), so what follows happens inside a page."""
    prepared, _, _ = await work.prepare((await _pages())[0], ingest_options(), encode=True, count=False)
    assert prepared is not None and work._process is not None
    return work._process


def test_bm25_pickles_as_its_parameters() -> None:
    for encoder in (Bm25Encoder(), Bm25Encoder(avg_len=40), Bm25Encoder(k1=1.5, languages=("german",))):
        copy = pickle.loads(pickle.dumps(encoder))
        assert (copy.name, copy.k1, copy.b, copy.languages) == (encoder.name, encoder.k1, encoder.b,
                                                                encoder.languages)
        text = "Die Rotation der Schlüssel läuft monatlich; the keys rotate monthly (v2.3)."
        assert copy.encode_document(text) == encoder.encode_document(text)


def test_serve_prepares_pages_in_a_worker_process_and_commands_in_a_thread() -> None:
    sparse = Bm25Encoder()
    settings = production_settings()
    assert isinstance(make_page_work(settings.ingest, sparse, serving=True), ProcessPageWork)
    assert isinstance(make_page_work(settings.ingest, sparse), ThreadPageWork)
    off = production_settings(page_process="no").ingest
    assert isinstance(make_page_work(off, sparse, serving=True), ThreadPageWork)
    on = production_settings(page_process="yes", page_process_nice=3).ingest
    assert isinstance(make_page_work(on, sparse), ProcessPageWork)


async def test_the_worker_process_prepares_what_a_thread_prepares_at_a_lower_priority() -> None:
    options, sparse = ingest_options(), Bm25Encoder()
    work = ProcessPageWork(sparse, nice=7)
    try:
        for page in await _pages():
            here = await ThreadPageWork(sparse).prepare(page, options, encode=True, count=True)
            there = await work.prepare(page, options, encode=True, count=True)
            assert here[0] is not None and there[0] is not None and there[1] == ""
            assert there[0].split.evidence == here[0].split.evidence
            assert (there[0].texts, there[0].dense_texts) == (here[0].texts, here[0].dense_texts)
            assert there[0].sparse == here[0].sparse and there[0].sparse is not None
            assert there[0].words == here[0].words and there[0].words is not None
        assert work.started == 1  # one child for every page
        assert work._process is not None
        lower = min(19, os.getpriority(os.PRIO_PROCESS, 0) + 7)
        assert os.getpriority(os.PRIO_PROCESS, work._process.pid) == lower
    finally:
        await work.close()
    assert work._process is None


async def test_a_page_whose_worker_dies_fails_alone_and_the_next_page_gets_a_new_worker() -> None:
    options, pages = ingest_options(), await _pages()
    work = ProcessPageWork(Bm25Encoder(), nice=0)
    try:
        child = await _warm(work)
        pending = asyncio.ensure_future(work.prepare(_big_page(), options, encode=True, count=True))
        await asyncio.sleep(0.3)  # inside the big page's second of CPU
        child.kill()
        prepared, why, _ = await pending
        assert prepared is None and why == "the page worker process died on this page (exit code -9)"
        again, why, _ = await work.prepare(pages[0], options, encode=True, count=False)
        assert again is not None and why == "" and work.started == 2
        assert work._process is not None
        work._process.kill()  # between pages: the next page is not failed for it
        work._process.wait(10)
        after, why, _ = await work.prepare(pages[1], options, encode=True, count=False)
        assert after is not None and why == "" and work.started == 3
    finally:
        await work.close()


async def test_a_page_over_its_cpu_deadline_stops_the_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    options = ingest_options()
    work = ProcessPageWork(Bm25Encoder(), nice=0)
    try:
        await _warm(work)
        monkeypatch.setattr(page_worker, "START_S", 0.0)
        hurried = dataclasses.replace(options, parse=dataclasses.replace(options.parse, timeout_s=0.05))
        prepared, why, cpu = await work.prepare(_big_page(), hurried, encode=True, count=False)
        assert prepared is None and why == "preparing the page took over 0.1 s of CPU: its worker was stopped"
        assert 0.1 < cpu < 1.0 and work._process is None
        monkeypatch.setattr(page_worker, "START_S", 60.0)
        prepared, why, _ = await work.prepare(_big_page(), options, encode=True, count=False)
        assert prepared is not None and why == "" and work.started == 2
    finally:
        await work.close()


async def test_closing_during_a_page_ends_that_page_at_once() -> None:
    work = ProcessPageWork(Bm25Encoder(), nice=0)
    child = await _warm(work)
    pending = asyncio.ensure_future(work.prepare(_big_page(), ingest_options(), encode=True, count=True))
    await asyncio.sleep(0.3)
    await work.close()
    prepared, why, _ = await pending
    assert prepared is None and why == "the page worker was closed"
    assert work._process is None and child.poll() is not None
    assert (await work.prepare(_big_page(), ingest_options(), encode=True, count=True))[1] == \
        "the page worker was closed"


class _OwnBm25(Bm25Encoder):
    """A sparse encoder the page worker cannot rebuild (it pickles as a plain ``Bm25Encoder``)."""


_Stored = list[tuple[str, str, SparseVector, str]]  # (evidence id, indexed text, sparse vector, page hash)


async def _ingest(work: PageWork, index_dir: Path, vocabulary: Path,
                  sparse: Bm25Encoder | None = None) -> tuple[_Stored, dict[str, int]]:
    embedder, sparse = HashEmbedder(), sparse or Bm25Encoder()
    index = EdgeIndex(index_dir)
    await index.open(dense_dim=embedder.dim, embedder=embedder.name)
    try:
        async with VocabularyRun.held(vocabulary, sparse, None, embedder, []) as words:
            assert words is not None
            report = await ingest_pages(await _pages(), index=index, embedder=embedder, sparse=sparse,
                                        options=ingest_options(), vocabulary=words, work=work)
            counts = dict(words.counts.df)
        assert report.failed == [] and report.added == 10
        points = [(p.evidence.id, p.content, p.sparse, p.page_hash) async for p in index.export_points(100)]
        return sorted(points), counts
    finally:
        await index.close()
        await work.close()


async def test_an_ingest_through_the_worker_process_writes_what_a_thread_writes(tmp_path: Path) -> None:
    threaded = await _ingest(ThreadPageWork(Bm25Encoder()), tmp_path / "a", tmp_path / "a.vocab")
    worker = await _ingest(ProcessPageWork(Bm25Encoder(), nice=5), tmp_path / "b", tmp_path / "b.vocab")
    assert threaded == worker and threaded[1]["rotation"] > 0


async def test_a_sparse_encoder_the_worker_cannot_rebuild_is_left_to_this_process(tmp_path: Path) -> None:
    own = _OwnBm25()
    work = ProcessPageWork(own, nice=0)
    try:
        prepared, _, _ = await work.prepare((await _pages())[0], ingest_options(), encode=True, count=True)
        assert prepared is not None and prepared.texts and prepared.sparse is None and prepared.words is None
    finally:
        await work.close()
    threaded = await _ingest(ThreadPageWork(own), tmp_path / "a", tmp_path / "a.vocab", own)
    worker = await _ingest(ProcessPageWork(own, nice=0), tmp_path / "b", tmp_path / "b.vocab", own)
    assert threaded == worker and threaded[1]["rotation"] > 0  # encoded and counted here instead


class _PoisonedEmbedder(HashEmbedder):
    """Fails every call whose texts hold ``poison``: a batch with that page fails as a whole."""

    def __init__(self, poison: str) -> None:
        super().__init__()
        self.poison = poison

    def embed_documents(self, texts: Sequence[str]) -> np.ndarray:
        if any(self.poison in t for t in texts):
            raise ValueError("poisoned")
        return super().embed_documents(texts)


class _FailingWrites:
    """The index, except that writing ``page_id`` fails."""

    def __init__(self, inner: EdgeIndex, page_id: str) -> None:
        self.inner, self.page_id = inner, page_id

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def replace_page(self, page_id: str, page_hash: str, points: Sequence[IndexPoint]) -> None:
        if page_id == self.page_id:
            raise IndexError_(f"injected write failure for page {page_id}")
        await self.inner.replace_page(page_id, page_hash, points)


async def _counted(tmp: Path, pages: list[Page], embedder: HashEmbedder, fail_write: str = ""
                   ) -> dict[str, int]:
    index = EdgeIndex(tmp / "index")
    await index.open(dense_dim=embedder.dim, embedder=embedder.name)
    try:
        async with VocabularyRun.held(tmp / "vocab", Bm25Encoder(), None, embedder, []) as words:
            assert words is not None
            flaky: Any = _FailingWrites(index, fail_write)
            await ingest_pages(pages, index=flaky, embedder=embedder, sparse=Bm25Encoder(),
                               options=ingest_options(), vocabulary=words)
            return dict(words.counts.df)
    finally:
        await index.close()


async def test_words_are_counted_for_the_pages_written_and_only_those(tmp_path: Path) -> None:
    pages = await _pages()
    pages[3] = poisoned = dataclasses.replace(pages[3], body=pages[3].body + "<p>Marked qzxpoison.</p>")
    unwritten = pages[6]
    counts = await _counted(tmp_path / "a", pages, _PoisonedEmbedder("qzxpoison"), fail_write=unwritten.id)
    # the batch failed as a whole, so the other pages were embedded and written one by one: all counted
    written = [p for p in pages if p.id not in (poisoned.id, unwritten.id)]
    assert counts == await _counted(tmp_path / "b", written, HashEmbedder())


async def test_the_workers_parse_deadline_counts_its_cpu_time_not_the_time_it_waits() -> None:
    options = ingest_options()
    patient = dataclasses.replace(options, parse=dataclasses.replace(options.parse, timeout_s=2.0))
    work = ProcessPageWork(Bm25Encoder(), nice=0)
    try:
        child = await _warm(work)
        pending = asyncio.ensure_future(work.prepare(_long_page(20_000), patient, encode=True, count=False))
        await asyncio.sleep(0.5)  # inside its parse (about a second of CPU)
        os.kill(child.pid, signal.SIGSTOP)  # starved, as a worker at a lower priority is beside questions
        await asyncio.sleep(3.0)
        os.kill(child.pid, signal.SIGCONT)
        prepared, why, _ = await pending
        assert prepared is not None and why == ""
    finally:
        await work.close()


def test_a_parse_deadline_is_measured_on_the_clock_in_use() -> None:
    big = _long_page(6_000)
    hurried = ParseLimits(timeout_s=0.001, max_table_cells=500_000, min_coverage=0.9)
    with pytest.raises(ParseTimeoutError):
        parse_page(big.body, page_id=big.id, limits=hurried)
    try:
        use_clock(lambda: 0.0)  # a clock that does not move: no deadline passes
        assert parse_page(big.body, page_id=big.id, limits=hurried).elements
    finally:
        use_clock(time.monotonic)
