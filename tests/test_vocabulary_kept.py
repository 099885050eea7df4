"""The keyword vocabulary's word counts, kept in memory by a sync loop from one cycle to the next
(``KeptCounts``), and the vocabulary's update at the end of a cycle."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import sqlite3
import threading
import zipfile
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import ingest_options

from connectors.confluence import ConfluenceClient, ConfluenceSource, sync_confluence
from pipeline.index.edge import EdgeIndex
from pipeline.ingest.run import ingest_pages
from pipeline.ingest.vocabulary_run import KeptCounts, VocabularyRun
from pipeline.models.sparse import Bm25Encoder
from pipeline.models.vocabulary import TermCounts, Vocabulary, update_vocabulary
from pipeline.store import Store
from pipeline.types import Page
from tests.fake_confluence import BASE_TIME, FakeConfluence, FakePage
from tests.test_keyword_expansion import PAGES, TrigramEmbedder


@pytest.fixture
async def index(tmp_path: Path) -> EdgeIndex:
    idx = EdgeIndex(tmp_path / "index")
    await idx.open(dense_dim=TrigramEmbedder.dim, embedder=TrigramEmbedder.name)
    yield idx  # type: ignore[misc]
    await idx.close()


@pytest.fixture
def loads(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """The vocabularies whose counts were read from their files."""
    seen: list[Path] = []
    real = TermCounts.load.__func__  # type: ignore[attr-defined]

    def load(cls: type[TermCounts], path: Path) -> TermCounts:
        seen.append(path)
        return real(cls, path)  # type: ignore[no-any-return]

    monkeypatch.setattr(TermCounts, "load", classmethod(load))
    return seen


async def _fresh_df(tmp_path: Path, pages: Sequence[Page]) -> Counter[str]:
    """The word counts of ``pages`` ingested into a new index."""
    fresh = EdgeIndex(tmp_path / "fresh-index")
    await fresh.open(dense_dim=TrigramEmbedder.dim, embedder=TrigramEmbedder.name)
    try:
        await ingest_pages(pages, index=fresh, embedder=TrigramEmbedder(), sparse=Bm25Encoder(),
                           options=ingest_options(), vocabulary=tmp_path / "fresh.npz")
    finally:
        await fresh.close()
    return TermCounts.load(tmp_path / "fresh.npz").df


def _fake(page: Page, when: object = BASE_TIME) -> FakePage:
    return FakePage(id=page.id, title=page.title, space=page.space, body=page.body, when=when)  # type: ignore[arg-type]


async def test_a_sync_loop_reads_the_word_counts_once_for_all_its_cycles(
        index: EdgeIndex, tmp_path: Path, loads: list[Path]) -> None:
    """A cycle starts from the counts the previous one left in memory (reading them is work that grows with
    the wiki); what it saves is what a fresh count of the pages gives."""
    path, kept = tmp_path / "vocab.npz", KeptCounts()
    async with FakeConfluence([_fake(p) for p in PAGES], mode="dc") as fc:
        store = Store(tmp_path / "evident.db")

        async def cycle() -> None:
            source = ConfluenceSource(ConfluenceClient(fc.url, token=fc.token), spaces=["OPS"])
            report = await sync_confluence(source=source, index=index, embedder=TrigramEmbedder(),
                                           sparse=Bm25Encoder(), store=store, options=ingest_options(),
                                           vocabulary=path, kept=kept)
            source.close()
            assert report.failed == []

        await cycle()
        await cycle()  # nothing changed
        fc.edit("1", body="<h2>Revert</h2><p>Run kestrel revert for a failed canary.</p>")
        await cycle()
        fc.delete("2")
        await cycle()
        await store.close()
    assert loads == [path]
    edited = Page(id="1", title=PAGES[0].title, url="https://w/1", space="OPS",
                  body="<h2>Revert</h2><p>Run kestrel revert for a failed canary.</p>")
    want = await _fresh_df(tmp_path, [edited, PAGES[2]])
    assert TermCounts.load(path).df == want and kept.counts is not None and kept.counts.df == want
    assert "rollback" not in Vocabulary.load(path).terms


async def test_counts_another_run_wrote_are_read_again(index: EdgeIndex, tmp_path: Path,
                                                       loads: list[Path]) -> None:
    """A CLI ingest between two cycles changes the files: the next cycle reads them, not its own copy."""
    path, kept = tmp_path / "vocab.npz", KeptCounts()
    sparse = Bm25Encoder()
    async with VocabularyRun.held(path, sparse, None, TrigramEmbedder(), [], kept) as run:
        assert run is not None
        await run.count([("1", ["alpha beta", "alpha"])])
    async with VocabularyRun.held(path, sparse, None, TrigramEmbedder(), []) as other:  # no kept counts
        assert other is not None
        await other.count([("2", ["gamma", "gamma delta"])])
    async with VocabularyRun.held(path, sparse, None, TrigramEmbedder(), [], kept) as run:
        assert run is not None and run.counts.df["gamma"] == 2 and run.counts.df["alpha"] == 2
    assert len(loads) == 3


async def test_counts_of_a_run_that_failed_are_not_kept(tmp_path: Path, loads: list[Path]) -> None:
    path, kept = tmp_path / "vocab.npz", KeptCounts()
    with pytest.raises(RuntimeError, match="cycle broke"):
        async with VocabularyRun.held(path, Bm25Encoder(), None, TrigramEmbedder(), [], kept) as run:
            assert run is not None
            await run.count([("1", ["alpha beta"])])
            raise RuntimeError("cycle broke")
    assert kept.counts is None
    assert TermCounts.load(path).df["alpha"] == 1  # what was counted is saved all the same
    async with VocabularyRun.held(path, Bm25Encoder(), None, TrigramEmbedder(), [], kept) as run:
        assert run is not None and run.counts.df["alpha"] == 1
    assert len(loads) == 3  # the first start, the check above, and the start after the failure


async def test_a_page_emptied_takes_its_words_out_of_the_saved_counts(tmp_path: Path) -> None:
    """A page rewritten to no evidence changes the counts, though it adds no evidence: they are saved."""
    path = tmp_path / "vocab.npz"
    async with VocabularyRun.held(path, Bm25Encoder(), None, TrigramEmbedder(), []) as run:
        assert run is not None
        await run.count([("1", ["alpha beta"]), ("2", ["alpha gamma"])])
    async with VocabularyRun.held(path, Bm25Encoder(), None, TrigramEmbedder(), []) as run:
        assert run is not None
        await run.counted([("2", (Counter(), Counter()), 0)])
    df = TermCounts.load(path).df
    assert "gamma" not in df and df["alpha"] == 1


def _held_at_page_2(monkeypatch: pytest.MonkeyPatch, fails: Exception | None = None, *,
                    holding: bool = False) -> tuple[threading.Event, threading.Event]:
    """Counting page "2" waits (``started`` set) until ``release`` is set, then counts it or raises
    ``fails``; with ``holding`` it holds the counts' lock meanwhile, as a spill of rows does."""
    started, release = threading.Event(), threading.Event()
    real = TermCounts.set_contribution

    def held(self: TermCounts, page_id: str, contribution: Any, evidence: int) -> None:
        with self._lock if holding else contextlib.nullcontext():
            if page_id == "2":
                started.set()
                release.wait(10)
                if fails is not None:
                    raise fails
            real(self, page_id, contribution, evidence)

    monkeypatch.setattr(TermCounts, "set_contribution", held)
    return started, release


async def _two_pages_counted(path: Path, warnings: list[tuple[str, str]]) -> None:
    async with VocabularyRun.held(path, Bm25Encoder(), None, TrigramEmbedder(), warnings) as run:
        assert run is not None
        await run.count([("1", ["alpha beta"])])
        await run.count([("2", ["gamma delta"])])


async def test_a_cancelled_runs_counting_thread_is_waited_for_before_the_counts_are_saved(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A cancelled cycle's counting went on in its thread while the counts were saved: the rows committed
    could hold a page whose words the counts file did not, for good (or the thread opened the rows' database
    again after the run and held it)."""
    path = tmp_path / "vocab.npz"
    started, release = _held_at_page_2(monkeypatch)
    task = asyncio.create_task(_two_pages_counted(path, []))
    await asyncio.to_thread(started.wait, 10)
    task.cancel()
    await asyncio.sleep(0.1)
    assert not task.done()  # finish waits for the thread
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    df = TermCounts.load(path).df  # counts and rows of one save: the rows are those counted
    assert df["gamma"] == 1 and df["alpha"] == 1
    async with VocabularyRun.held(path, Bm25Encoder(), None, TrigramEmbedder(), []) as run:
        assert run is not None
        await run.count([("2", ["alpha"])])  # page 2's old words out: "gamma" was in the rows too
    df = TermCounts.load(path).df
    assert "gamma" not in df and df["alpha"] == 2


async def test_a_counting_thread_that_fails_after_its_caller_was_cancelled_stops_counting(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its failure went unread: the run saved counts that thread had left half-changed."""
    path = tmp_path / "vocab.npz"
    started, release = _held_at_page_2(monkeypatch, sqlite3.OperationalError("disk I/O error"))
    settled = VocabularyRun._settled

    async def late(self: VocabularyRun) -> None:
        """The thread ends (and fails) before the end of the run looks."""
        release.set()
        await asyncio.wait(list(self._pending))
        await settled(self)

    monkeypatch.setattr(VocabularyRun, "_settled", late)
    warnings: list[tuple[str, str]] = []
    task = asyncio.create_task(_two_pages_counted(path, warnings))
    await asyncio.to_thread(started.wait, 10)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert warnings and "counting stopped" not in warnings[0][1]  # the run's own warning: counts dropped
    assert "keyword-expansion counts dropped: OperationalError: disk I/O error" in warnings[0][1]
    assert not TermCounts.path_for(path).exists()  # the next run counts afresh


def test_retired_counts_are_not_taken_by_the_next_run(tmp_path: Path) -> None:
    """A run cancelled while keeping its counts retired them after the keep: the next run took counts that
    ignore every change, so nothing was saved again."""
    path = tmp_path / "vocab.npz"
    counts = TermCounts(TermCounts.pages_for(path))
    kept = KeptCounts()
    kept.keep(path, counts)
    counts.retire()
    assert kept.take(path) is None


def test_retired_counts_change_nothing_and_open_no_database(tmp_path: Path) -> None:
    counts = TermCounts(tmp_path / "pages.sqlite")
    counts.retire()
    counts.set_page("1", ["alpha"], Bm25Encoder())
    counts.forget(["2"])
    assert not counts.df and not (tmp_path / "pages.sqlite").exists()


async def test_a_start_that_fails_lets_go_of_the_vocabulary_lock(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The lock was held by a leaked descriptor: the next cycle in the same process waited forever."""
    path, kept = tmp_path / "vocab.npz", KeptCounts()
    async with VocabularyRun.held(path, Bm25Encoder(), None, TrigramEmbedder(), [], kept) as run:
        assert run is not None
        await run.count([("1", ["alpha beta"])])

    def broken(cls: type[TermCounts], vocabulary: Path) -> TermCounts:
        raise MemoryError("no room")

    monkeypatch.setattr(KeptCounts, "take", lambda self, p: None)
    monkeypatch.setattr(TermCounts, "load", classmethod(broken))
    with pytest.raises(MemoryError):
        await VocabularyRun.start(path, Bm25Encoder(), None, kept)
    monkeypatch.undo()
    fd = os.open(path.with_name(path.stem + ".lock"), os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # BlockingIOError while the failed start holds it
    finally:
        os.close(fd)
    run = await VocabularyRun.start(path, Bm25Encoder(), None)
    assert run is not None and run.counts.df["alpha"] == 1
    run.release()


def test_kept_counts_whose_files_cannot_be_stamped_are_not_used(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    path, kept = tmp_path / "vocab.npz", KeptCounts(TermCounts(tmp_path / "p.sqlite"), (None, None))

    def denied(self: Path) -> None:
        raise PermissionError("denied")

    monkeypatch.setattr(Path, "stat", denied)
    assert kept.take(path) is None


def test_the_update_keeps_known_words_vectors_and_embeds_only_new_words(tmp_path: Path) -> None:
    path = tmp_path / "vocab.npz"
    marked = np.full((2, TrigramEmbedder.dim), 1 / 16, dtype=np.float16)  # not what the embedder gives
    Vocabulary(("alpha", "beta"), marked, frozenset({"alpha", "beta"}), TrigramEmbedder.name).save(path)
    asked: list[str] = []

    class Counting(TrigramEmbedder):
        def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
            asked.extend(texts)
            return super().embed_queries(texts)

    counts = TermCounts(TermCounts.pages_for(path), Counter({"alpha": 3, "gamma": 2, "beta": 2}))
    vocab = update_vocabulary(path, counts, Bm25Encoder(), Counting())
    assert vocab.terms == ("alpha", "gamma", "beta") and asked == ["gamma"]
    rows = dict(zip(vocab.terms, Vocabulary.load(path).vectors, strict=True))
    assert np.array_equal(rows["alpha"], marked[0]) and np.array_equal(rows["beta"], marked[1])
    want = TrigramEmbedder().embed_queries(["gamma"])[0].astype(np.float16)
    assert np.allclose(rows["gamma"], want, atol=1e-3)
    with zipfile.ZipFile(path) as z:  # vectors barely compress: stored, read back without inflating
        assert z.getinfo("vectors.npy").compress_type == zipfile.ZIP_STORED


def test_a_previous_vocabulary_whose_vectors_do_not_fit_its_words_is_embedded_afresh(tmp_path: Path) -> None:
    path = tmp_path / "vocab.npz"
    broken = np.ones((1, TrigramEmbedder.dim), dtype=np.float16)  # two words, one row
    Vocabulary(("alpha", "beta"), broken, frozenset(), TrigramEmbedder.name).save(path)
    counts = TermCounts(TermCounts.pages_for(path), Counter({"alpha": 2, "beta": 2}))
    vocab = update_vocabulary(path, counts, Bm25Encoder(), TrigramEmbedder())
    want = TrigramEmbedder().embed_queries(["alpha", "beta"]).astype(np.float16)
    assert np.allclose(vocab.vectors, want, atol=1e-3)
