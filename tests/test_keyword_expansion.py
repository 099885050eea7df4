"""Keyword expansion: the corpus vocabulary kept by ingest and sync, and unknown query words mapped onto
it."""

from __future__ import annotations

import asyncio
import threading
import time
import zlib
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
from helpers import ingest_options

from connectors.confluence import ConfluenceClient, ConfluenceSource, sync_confluence
from evident.settings import Settings
from pipeline.access.scope import EVERYTHING
from pipeline.answer.retrieve import retrieve
from pipeline.answer.settings import RetrievalSettings
from pipeline.factory import drop_index, make_expander_from, vocabulary_path
from pipeline.index.edge import EdgeIndex
from pipeline.ingest.run import ingest_pages
from pipeline.ingest.vocabulary_run import VocabularyRun
from pipeline.models.sparse import Bm25Encoder
from pipeline.models.vocabulary import KeywordExpander, TermCounts, Vocabulary
from pipeline.store import Store
from pipeline.types import Page
from tests.fake_confluence import BASE_TIME, FakeConfluence, FakePage


class TrigramEmbedder:
    """Character-trigram vectors (hashed into 256 dims): words that share spelling are close, as a typo is to
    its word. Deterministic and local; enough to exercise nearest-word lookups without a model."""

    name = "test-trigram-256"
    dim = 256

    def _vec(self, text: str) -> np.ndarray:
        v = np.zeros(self.dim, dtype=np.float32)
        padded = f"  {text.lower()}  "
        for i in range(len(padded) - 2):
            v[zlib.crc32(padded[i:i + 3].encode()) % self.dim] += 1.0
        return v / (np.linalg.norm(v) or 1.0)

    def embed_documents(self, texts: Sequence[str]) -> np.ndarray:
        return np.stack([self._vec(t) for t in texts]) if texts else np.zeros((0, self.dim), np.float32)

    def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        return self.embed_documents(texts)

    def close(self) -> None:
        pass


PAGES = [  # one evidence per section: a word in two sections is in two evidence
    Page(id="1", title="Deployment runbook", url="https://w/1", space="OPS",
         body="<h2>Rollback</h2><p>Run kestrel rollback for a failed canary.</p>"
              "<h2>After</h2><p>A rollback restores the previous image.</p>"),
    Page(id="2", title="Hardware inventory", url="https://w/2", space="OPS",
         body="<h2>Servers</h2><p>The firmware of every server is updated each quarter.</p>"
              "<h2>Notes</h2><p>Server firmware notes.</p>"),
    Page(id="3", title="Glossary", url="https://w/3", space="OPS",
         body="<h2>Canary</h2><p>A canary serves a small share of traffic.</p>"
              "<h2>Kestrel</h2><p>Kestrel is the pipeline.</p>"),
]


@pytest.fixture
async def index(tmp_path: Path) -> EdgeIndex:
    idx = EdgeIndex(tmp_path / "index")
    await idx.open(dense_dim=TrigramEmbedder.dim, embedder=TrigramEmbedder.name)
    yield idx  # type: ignore[misc]
    await idx.close()


async def _ingest(index: EdgeIndex, pages: Sequence[Page], vocab: Path | None, **kw: object) -> None:
    report = await ingest_pages(pages, index=index, embedder=TrigramEmbedder(), sparse=Bm25Encoder(),
                                options=ingest_options(), vocabulary=vocab, **kw)  # type: ignore[arg-type]
    assert report.failed == []


async def test_ingest_keeps_the_vocabulary_and_an_unknown_word_finds_its_page(
    index: EdgeIndex, tmp_path: Path
) -> None:
    path = tmp_path / "vocab.npz"
    await _ingest(index, PAGES, path)
    vocab = Vocabulary.load(path)
    assert {"rollback", "firmware", "canary", "server"} <= set(vocab.terms)  # in two or more evidence
    assert "quarter" not in vocab.terms  # in one evidence only: not a target
    expander = KeywordExpander(path, TrigramEmbedder(), Bm25Encoder())
    lexical = RetrievalSettings(mode="lexical", final_k=3, confidence=False)
    plain = await retrieve("how do I rollbak", index=index, embedder=TrigramEmbedder(), sparse=Bm25Encoder(),
                           config=lexical, scope=EVERYTHING)
    assert plain.hits == []  # BM25 alone: "rollbak" matches nothing
    r = await retrieve(
        "how do I rollbak",
        index=index,
        embedder=TrigramEmbedder(),
        sparse=Bm25Encoder(),
        config=RetrievalSettings(
            mode="lexical", final_k=3, confidence=False, keyword_weight=0.5, keyword_min_similarity=0.5
        ),
        expander=expander,
        scope=EVERYTHING,
    )
    assert [(w, t) for w, t, _ in r.expansions] == [("rollbak", "rollback")]
    assert r.hits and r.hits[0].evidence.page_id == "1" and "expand" in r.timings_ms


async def test_known_words_and_weight_zero_are_not_expanded(index: EdgeIndex, tmp_path: Path) -> None:
    path = tmp_path / "vocab.npz"
    await _ingest(index, PAGES, path)
    expander = KeywordExpander(path, TrigramEmbedder(), Bm25Encoder())
    vocab = expander.vocabulary()
    assert vocab is not None
    assert expander.unknown_words("Which firmware do the servers run, and the rollbak?", vocab) == ["rollbak"]
    r = await retrieve(
        "rollbak",
        index=index,
        embedder=TrigramEmbedder(),
        sparse=Bm25Encoder(),
        config=RetrievalSettings(mode="lexical", confidence=False, keyword_weight=0.0),
        expander=expander,
        scope=EVERYTHING,
    )
    assert r.expansions == [] and r.hits == []
    strict = expander.expansions("rollbak", min_similarity=0.99)
    assert strict == []  # nothing that close


async def test_an_index_built_without_a_vocabulary_gets_one_from_its_unchanged_pages(index: EdgeIndex,
                                                                                      tmp_path: Path) -> None:
    await _ingest(index, PAGES, None)
    path = tmp_path / "vocab.npz"
    await _ingest(index, PAGES, path)  # every page unchanged: parsed (not embedded) to count its words
    assert "rollback" in Vocabulary.load(path).terms
    counts = TermCounts.load(path)
    assert counts.df["rollback"] == 2 and counts.added == 0
    await _ingest(index, [*PAGES, Page(id="4", title="Rollback drill", url="https://w/4", space="OPS",
                                       body="<h2>Drill</h2><p>Practise the rollback monthly.</p>"
                                            "<h2>When</h2><p>Monthly drills.</p>")], path)
    assert TermCounts.load(path).df["rollback"] == 3  # counted once more: only the new page was read
    assert "monthly" in Vocabulary.load(path).terms


async def test_a_vocabulary_of_another_embedder_or_an_unreadable_file_turns_expansion_off(
        index: EdgeIndex, tmp_path: Path) -> None:
    path = tmp_path / "vocab.npz"
    await _ingest(index, PAGES, path)

    class Other(TrigramEmbedder):
        name = "another-model"

    assert KeywordExpander(path, Other(), Bm25Encoder()).expansions("rollbak", min_similarity=0.1) == []
    path.write_bytes(b"not a zip")
    assert KeywordExpander(path, TrigramEmbedder(), Bm25Encoder()).vocabulary() is None
    TermCounts.path_for(path).write_bytes(b"PK\x03\x04 damaged")
    # unreadable counts and vocabulary: counted afresh from the unchanged pages
    await _ingest(index, PAGES, path)
    assert "rollback" in Vocabulary.load(path).terms and TermCounts.load(path).df["rollback"] == 2


async def test_settings_place_the_vocabulary_with_its_index_and_drop_removes_it(tmp_path: Path) -> None:
    settings = Settings.load(env={"EVIDENT_DATA_DIR": str(tmp_path)})
    assert settings.retrieval.keyword_weight == 0.5  # on by default (BENCHMARKS.md)
    path = vocabulary_path(settings)
    assert path is not None and path.parent == tmp_path / "vocabulary"
    assert vocabulary_path(settings, tmp_path / "other") != path  # one per index
    assert vocabulary_path(settings.replace(keyword_weight=0.0)) is None
    assert vocabulary_path(settings.replace(sparse_encoder="bge-m3")) is None
    assert isinstance(make_expander_from(settings, TrigramEmbedder(), Bm25Encoder()), KeywordExpander)
    path.parent.mkdir(parents=True)
    path.write_bytes(b"x")
    TermCounts.path_for(path).write_bytes(b"x")
    TermCounts.pages_for(path).write_bytes(b"x")
    await drop_index(settings)
    assert not path.exists() and not TermCounts.path_for(path).exists()
    assert not TermCounts.pages_for(path).exists()


async def test_sync_without_word_counts_reads_every_page_once_to_count_them(
    index: EdgeIndex, tmp_path: Path
) -> None:
    pages = [FakePage(id=p.id, title=p.title, space=p.space, body=p.body, when=BASE_TIME) for p in PAGES]
    async with FakeConfluence(pages, mode="dc") as fc:
        store = Store(tmp_path / "evident.db")

        async def sync(vocab: Path | None) -> int:
            source = ConfluenceSource(ConfluenceClient(fc.url, token=fc.token), spaces=["OPS"])
            report = await sync_confluence(source=source, index=index, embedder=TrigramEmbedder(),
                                           sparse=Bm25Encoder(), store=store, options=ingest_options(),
                                           vocabulary=vocab)
            source.close()
            return report.pages_seen

        assert await sync(None) == 3
        assert await sync(None) == 0  # incremental, nothing changed (the overlap's page is known)
        path = tmp_path / "vocab.npz"
        assert await sync(path) == 3  # no counts yet: every page is read (unchanged ones are not embedded)
        assert "rollback" in Vocabulary.load(path).terms
        assert await sync(path) == 0
        await store.close()


async def test_a_sync_over_several_spaces_loads_and_saves_the_word_counts_once(
        index: EdgeIndex, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One load and one save per sync cycle, however many spaces it covers; every space's words are
    counted."""
    calls = {"load": 0, "save": 0}
    real_load, real_save = TermCounts.load.__func__, TermCounts.save  # type: ignore[attr-defined]

    def load(cls: type[TermCounts], path: Path) -> TermCounts:
        calls["load"] += 1
        return real_load(cls, path)  # type: ignore[no-any-return]

    def save(self: TermCounts, path: Path) -> None:
        calls["save"] += 1
        real_save(self, path)

    monkeypatch.setattr(TermCounts, "load", classmethod(load))
    monkeypatch.setattr(TermCounts, "save", save)
    spaces = ["OPS", "DEV", "SEC"]
    pages = [FakePage(id=f"{i}{p.id}", title=f"{p.title} {key}", space=key, body=p.body, when=BASE_TIME)
             for i, key in enumerate(spaces) for p in PAGES]
    pages.append(
        FakePage(
            id="99",
            title="Security notes",
            space="SEC",
            when=BASE_TIME,
            body="<h2>A</h2><p>Quarantine the laptop.</p><h2>B</h2><p>A quarantine lasts a day.</p>",
        )
    )
    path = tmp_path / "vocab.npz"
    async with FakeConfluence(pages, mode="dc") as fc:
        store = Store(tmp_path / "evident.db")
        source = ConfluenceSource(ConfluenceClient(fc.url, token=fc.token), spaces=spaces)
        report = await sync_confluence(
            source=source,
            index=index,
            embedder=TrigramEmbedder(),
            sparse=Bm25Encoder(),
            store=store,
            options=ingest_options(),
            vocabulary=path,
        )
        source.close()
        await store.close()
    assert report.pages_seen == 10 and report.failed == []
    assert calls == {"load": 1, "save": 1}
    assert {"rollback", "quarantine"} <= set(Vocabulary.load(path).terms)


async def test_a_rewritten_page_takes_its_old_words_out_of_the_counts(index: EdgeIndex,
                                                                     tmp_path: Path) -> None:
    path = tmp_path / "vocab.npz"
    await _ingest(index, PAGES, path)
    assert TermCounts.load(path).df["rollback"] == 2
    rewritten = Page(id="1", title="Deployment runbook", url="https://w/1", space="OPS",
                     body="<h2>Revert</h2><p>Run kestrel revert for a failed canary.</p>"
                          "<h2>After</h2><p>A revert restores the previous image.</p>")
    await _ingest(index, [rewritten, *PAGES[1:]], path)
    counts = TermCounts.load(path)
    assert "rollback" not in counts.df and counts.df["revert"] == 2  # not 2 + 2 rewrites later
    assert "rollback" not in Vocabulary.load(path).terms
    assert not any(s.startswith("rollback") for s in Vocabulary.load(path).stems)  # unknown again
    assert counts.df["kestrel"] == 2 and counts.df["canary"] == 2  # words kept by the rewrite stay counted
    await _ingest(index, [PAGES[0], *PAGES[1:]], path)  # and back: the same counts as at first
    assert TermCounts.load(path).df == (await _fresh_counts(tmp_path, PAGES)).df


async def _fresh_counts(tmp_path: Path, pages: Sequence[Page]) -> TermCounts:
    fresh = EdgeIndex(tmp_path / "fresh-index")
    await fresh.open(dense_dim=TrigramEmbedder.dim, embedder=TrigramEmbedder.name)
    try:
        await _ingest(fresh, pages, tmp_path / "fresh.npz")
    finally:
        await fresh.close()
    return TermCounts.load(tmp_path / "fresh.npz")


async def test_a_page_deleted_in_confluence_leaves_the_counts(index: EdgeIndex, tmp_path: Path) -> None:
    pages = [FakePage(id=p.id, title=p.title, space=p.space, body=p.body, when=BASE_TIME) for p in PAGES]
    async with FakeConfluence(pages, mode="dc") as fc:
        store = Store(tmp_path / "evident.db")
        path = tmp_path / "vocab.npz"

        async def sync() -> None:
            source = ConfluenceSource(ConfluenceClient(fc.url, token=fc.token), spaces=["OPS"])
            await sync_confluence(source=source, index=index, embedder=TrigramEmbedder(),
                                  sparse=Bm25Encoder(), store=store, options=ingest_options(),
                                  vocabulary=path)
            source.close()

        await sync()
        assert TermCounts.load(path).df["firmware"] == 2
        fc.delete("2")
        await sync()
        counts = TermCounts.load(path)
        assert "firmware" not in counts.df and "server" not in counts.df
        assert counts.df == (await _fresh_counts(tmp_path, [PAGES[0], PAGES[2]])).df
        await store.close()


async def test_counts_kept_without_per_page_rows_are_counted_afresh(index: EdgeIndex,
                                                                   tmp_path: Path) -> None:
    """Counts of an earlier release cannot take a page's words out: they are rebuilt from the pages once."""
    path = tmp_path / "vocab.npz"
    await _ingest(index, PAGES, path)
    TermCounts.pages_for(path).unlink()
    counts = TermCounts.load(path)
    assert not counts.df
    await _ingest(index, PAGES, path)  # every page unchanged: parsed (not embedded) to count its words
    assert TermCounts.load(path).df["rollback"] == 2


def test_changed_pages_spill_to_disk_and_commit_only_with_the_counts(tmp_path: Path) -> None:
    """A cold sync of 50,000 pages held every page's counters until the end (2.2 GB): they spill into the
    open transaction, and only ``save`` commits them, with the counts they belong to."""
    path, sparse = tmp_path / "vocab.npz", Bm25Encoder()
    counts = TermCounts.load(path)
    for i in range(300):
        counts.set_page(f"p{i}", ["alpha"], sparse)
    counts.save(path)
    counts = TermCounts.load(path)
    for i in range(600):
        counts.set_page(f"p{i}", [f"beta word{chr(97 + i % 26)}"], sparse)
    assert len(counts._changed) < 256  # spilled
    counts.set_page("p1", ["gamma"], sparse)  # a spilled page rewritten: its old words come out
    assert counts.df["beta"] == 599 and counts.df["gamma"] == 1 and "alpha" not in counts.df
    counts.close()  # not saved: the spilled rows are rolled back with the rest
    kept = TermCounts.load(path)
    assert kept.df["alpha"] == 300 and "beta" not in kept.df
    kept.forget([f"p{i}" for i in range(100)])  # the rows kept are the saved ones: alpha comes out
    assert kept.df["alpha"] == 200


def test_counts_and_rows_of_different_saves_are_counted_afresh(tmp_path: Path) -> None:
    """A crash between committing the rows and moving the counts file into place leaves them apart."""
    path, sparse = tmp_path / "vocab.npz", Bm25Encoder()
    counts = TermCounts.load(path)
    counts.set_page("a", ["alpha beta"], sparse)
    counts.save(path)
    older = TermCounts.path_for(path).read_bytes()
    counts = TermCounts.load(path)
    counts.set_page("a", ["gamma"], sparse)
    counts.save(path)
    TermCounts.path_for(path).write_bytes(older)  # the rows are of the second save, the counts of the first
    assert not TermCounts.load(path).df


async def test_damaged_per_page_rows_never_fail_the_ingest(index: EdgeIndex, tmp_path: Path) -> None:
    path = tmp_path / "vocab.npz"
    await _ingest(index, PAGES, path)
    TermCounts.pages_for(path).write_bytes(b"not a database" * 200)
    await _ingest(index, PAGES, path)  # counted afresh from the unchanged pages
    assert TermCounts.load(path).df["rollback"] == 2


async def test_counting_that_fails_mid_run_is_dropped_not_fatal(index: EdgeIndex, tmp_path: Path) -> None:
    path = tmp_path / "vocab.npz"
    await _ingest(index, PAGES, path)
    pages = TermCounts.pages_for(path)
    pages.unlink()
    pages.mkdir()  # cannot be opened as a database, nor deleted as a file
    report = await ingest_pages([*PAGES[:2], Page(id="9", title="New", url="https://w/9", space="OPS",
                                                  body="<p>Fresh words here.</p>")],
                                index=index, embedder=TrigramEmbedder(), sparse=Bm25Encoder(),
                                options=ingest_options(), vocabulary=path)
    assert report.added == 1
    assert any(where == "vocabulary" for where, _ in report.warnings)
    assert not TermCounts.path_for(path).exists()  # the next run counts afresh
    pages.rmdir()
    await _ingest(index, PAGES[:2], path)
    assert TermCounts.load(path).df["rollback"] == 2


async def test_two_runs_on_one_vocabulary_take_turns(tmp_path: Path) -> None:
    path = tmp_path / "vocab.npz"
    first = await VocabularyRun.start(path, Bm25Encoder(), None)
    assert first is not None
    second = asyncio.create_task(VocabularyRun.start(path, Bm25Encoder(), None))
    await asyncio.sleep(0.3)
    assert not second.done()  # waits while the first holds the counts
    await first.count([("a", ["alpha"])])
    await first.finish(TrigramEmbedder(), [])
    run = await asyncio.wait_for(second, 5)
    assert run is not None and run.counts.df["alpha"] == 1  # sees what the first saved
    run.release()


class _HeldReads(KeywordExpander):
    """An expander whose file reads after the first wait for ``release``: a slow reload, made visible."""

    def __init__(self, *args: object) -> None:
        super().__init__(*args)  # type: ignore[arg-type]
        self.release = threading.Event()
        self.reads = 0

    def _read(self) -> Vocabulary | None:
        self.reads += 1
        if self.reads > 1:
            assert self.release.wait(10)
        return super()._read()


def _write_vocabulary(path: Path, words: Sequence[str]) -> None:
    vectors = TrigramEmbedder().embed_documents(words).astype(np.float16)
    Vocabulary(tuple(words), vectors, frozenset(words), TrigramEmbedder.name).save(path)


def test_a_changed_vocabulary_is_read_in_the_background_while_questions_use_the_one_they_had(
        tmp_path: Path) -> None:
    path = tmp_path / "vocab.npz"
    _write_vocabulary(path, ["rollback", "canary"])
    expander = _HeldReads(path, TrigramEmbedder(), Bm25Encoder())
    first = expander.vocabulary()
    assert first is not None and first.vectors.dtype == np.float32  # compared as float32, converted once
    _write_vocabulary(path, ["firmware", "servers", "inventory"])
    started = time.monotonic()
    assert expander.vocabulary() is first  # the question does not wait for the read
    assert expander.expansions("rollbak", min_similarity=0.5)[0][1] == "rollback"
    assert time.monotonic() - started < 5
    assert expander.reads <= 2 and expander._reloading is not None  # one reload, however many questions
    expander.release.set()
    assert expander.wait_reloaded(10)
    now = expander.vocabulary()
    assert now is not None and now.terms == ("firmware", "servers", "inventory")
    assert expander.expansions("firmwre", min_similarity=0.5)[0][1] == "firmware"


def test_a_vocabulary_that_became_unreadable_turns_expansion_off_after_the_reload(tmp_path: Path) -> None:
    path = tmp_path / "vocab.npz"
    _write_vocabulary(path, ["rollback", "canary"])
    expander = KeywordExpander(path, TrigramEmbedder(), Bm25Encoder())
    assert expander.vocabulary() is not None
    path.write_bytes(b"not a zip")
    expander.vocabulary()
    assert expander.wait_reloaded(10) and expander.vocabulary() is None


class _FailingReload(KeywordExpander):
    """An expander whose second read fails the way nothing expects (memory, say)."""

    reads = 0

    def _read(self) -> Vocabulary | None:
        self.reads += 1
        if self.reads == 2:
            raise MemoryError("no room for the float32 copy")
        return super()._read()


def test_a_reload_that_fails_turns_expansion_off_until_the_file_changes_again(tmp_path: Path) -> None:
    path = tmp_path / "vocab.npz"
    _write_vocabulary(path, ["rollback", "canary"])
    expander = _FailingReload(path, TrigramEmbedder(), Bm25Encoder())
    assert expander.vocabulary() is not None
    _write_vocabulary(path, ["firmware", "servers", "inventory"])
    expander.vocabulary()
    assert expander.wait_reloaded(10) and expander.vocabulary() is None  # logged, off
    _write_vocabulary(path, ["kestrel", "pipeline"])
    now = expander.vocabulary()  # nothing to answer with meanwhile: read now, not blocked by the failure
    assert now is not None and now.terms == ("kestrel", "pipeline")
