"""One run's hold on the keyword-expansion vocabulary: its word counts loaded at ``start``, changed as pages
are written, rewritten and deleted, saved with the vocabulary at ``finish``.

One run at a time per vocabulary: ``start`` takes an exclusive lock on ``<vocabulary>.lock`` (waiting, with a
log line, while another process's run holds it; serve's sync cycle and a CLI ingest take turns), so two runs
never load the same counts and overwrite each other's. Counting never fails the run: a failure there (a
damaged or full per-page database, say) turns counting off for the rest of it and deletes the counts, so the
next run counts afresh.

A sync loop (``evident serve``) keeps its counts between cycles (``KeptCounts``): a cycle starts from them,
not from the files, unless another run wrote the files since. Loading them is work that grows with the wiki
(115,000 words at 50,000 pages, 80 ms of CPU holding the GIL), which a cycle that changes nothing must not do.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import sqlite3
import zlib
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from pipeline.errors import EvidentError
from pipeline.models.sparse import Bm25Encoder
from pipeline.models.term_counts import Contribution, TermCounts
from pipeline.models.vocabulary import update_vocabulary
from pipeline.protocols import Embedder, SparseEncoder

log = logging.getLogger(__name__)
_T = TypeVar("_T")

COUNTING_FAILS = (sqlite3.Error, zlib.error, ValueError, OSError)


def _lock(path: Path) -> int:
    """An exclusive lock on ``<vocabulary>.lock`` (blocking), as an open descriptor."""
    lock = path.with_name(path.stem + ".lock")
    lock.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        log.info("waiting for another run's keyword vocabulary (%s)", lock)
        fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


Stamp = tuple[tuple[int, int, int] | None, ...]


def _stamp(path: Path) -> Stamp:
    """What identifies the counts' files as one save wrote them: inode, modification time and size of the
    counts and of the per-page rows (a save replaces the one and commits to the other)."""
    out: list[tuple[int, int, int] | None] = []
    for file in (TermCounts.path_for(path), TermCounts.pages_for(path)):
        try:
            st = file.stat()
        except FileNotFoundError:
            out.append(None)
        else:
            out.append((st.st_ino, st.st_mtime_ns, st.st_size))
    return tuple(out)


@dataclass
class KeptCounts:
    """One sync loop's word counts between its runs: what its last run left in memory, and the stamp of the
    files that run left; the next run takes them while the files are still those."""

    counts: TermCounts | None = None
    stamp: Stamp | None = None

    def take(self, path: Path) -> TermCounts | None:
        """The kept counts while the files are as their run left them (None: read the files)."""
        counts, self.counts = self.counts, None
        if counts is None or counts.retired:  # a run cancelled while keeping them retired them
            return None
        try:
            same = self.stamp == _stamp(path)
        except OSError as exc:  # the files cannot be stamped: they are read as they are
            log.info("keyword vocabulary: kept counts not used (%s)", exc)
            return None
        return counts if same else None

    def keep(self, path: Path, counts: TermCounts) -> None:
        """After ``counts`` were saved to ``path`` (or loaded, and left unchanged); kept only while their
        files can be stamped."""
        counts.close()
        counts.added = 0
        try:
            self.counts, self.stamp = counts, _stamp(path)
        except OSError as exc:
            self.counts = self.stamp = None
            log.info("keyword vocabulary: counts not kept for the next run (%s)", exc)


@dataclass
class VocabularyRun:
    """The keyword-expansion vocabulary kept up to date by one ingest run or one whole sync: the words of the
    evidence written are counted (BM25 only); while no counts exist yet, unchanged pages are parsed, not
    embedded, to count theirs (``bootstrap``; by default while no readable counts exist)."""

    path: Path
    counts: TermCounts
    sparse: Bm25Encoder
    bootstrap: bool  # no counts were kept yet: unchanged pages are parsed (not embedded) to count their words
    existed: bool
    lock_fd: int
    failed: str | None = None  # why counting stopped in this run
    # counting in threads: a cancelled caller's goes on, and ``finish`` waits for it before saving
    _pending: set[asyncio.Future[None]] = field(default_factory=set)

    @classmethod
    async def start(
        cls, path: Path | None, sparse: SparseEncoder, bootstrap: bool | None, kept: KeptCounts | None = None
    ) -> VocabularyRun | None:
        """Take the lock, then the counts: ``kept``'s while the files are as its last run left them, else
        the files' (empty when there are none yet, or they are unreadable: counted afresh)."""
        if path is None or not isinstance(sparse, Bm25Encoder):
            return None

        def load() -> VocabularyRun:
            fd = _lock(path)
            try:
                counts = (kept.take(path) if kept is not None else None) or TermCounts.load(path)
                return cls(path, counts, sparse, not counts.df if bootstrap is None else bootstrap,
                           path.exists(), fd)
            except BaseException:  # the lock goes with it, or the next run waits for it forever
                os.close(fd)
                raise

        taking = asyncio.get_running_loop().run_in_executor(None, load)
        try:
            return await asyncio.shield(taking)
        except asyncio.CancelledError:  # the thread may still take the lock: a run nobody finishes lets it go
            taking.add_done_callback(_let_go)
            raise

    @classmethod
    @contextlib.asynccontextmanager
    async def held(cls, path: Path | None, sparse: SparseEncoder, bootstrap: bool | None, embedder: Embedder,
                   warnings: list[tuple[str, str]],
                   kept: KeptCounts | None = None) -> AsyncIterator[VocabularyRun | None]:
        """``start`` … ``finish``, also when the run fails or is cancelled: what was counted belongs to pages
        already written, so it is saved either way. ``kept``: the counts are kept for the next run only when
        this one ended normally (a cancelled run's counting thread may still be changing them)."""
        run = await cls.start(path, sparse, bootstrap, kept)
        ended = False
        try:
            yield run
            ended = True
        finally:
            if run is not None:
                await run.finish(embedder, warnings, kept if ended else None)

    async def count(self, pages: Sequence[tuple[str, Sequence[str]]]) -> None:
        """(page id, its evidence texts) for pages just written."""
        await self._counting(self._set_pages, pages)

    def _set_pages(self, pages: Sequence[tuple[str, Sequence[str]]]) -> None:
        for page_id, texts in pages:
            self.counts.set_page(page_id, texts, self.sparse)

    async def counted(self, pages: Sequence[tuple[str, Contribution, int]]) -> None:
        """(page id, its words as ``TermCounts.contribution`` counted them, its evidence count) for pages just
        written: ``count`` with the counting done where the page was prepared."""
        await self._counting(self._set_counted, pages)

    def _set_counted(self, pages: Sequence[tuple[str, Contribution, int]]) -> None:
        for page_id, words, evidence in pages:
            self.counts.set_contribution(page_id, words, evidence)

    async def forget(self, page_ids: Sequence[str]) -> None:
        """The pages left the index: their words leave the counts."""
        await self._counting(self.counts.forget, page_ids)

    async def _counting(self, work: Callable[[_T], None], arg: _T) -> None:
        if self.failed is not None:
            return
        job = asyncio.ensure_future(asyncio.to_thread(work, arg))
        self._pending.add(job)
        job.add_done_callback(self._counted)
        try:
            await asyncio.shield(job)  # cancelled, the thread still counts: ``finish`` waits for it
        except COUNTING_FAILS as exc:
            self._stop_counting(exc)

    def _counted(self, job: asyncio.Future[None]) -> None:
        """A counting thread ended: a failure stops counting, also where its caller was cancelled."""
        self._pending.discard(job)
        if not job.cancelled() and (exc := job.exception()) is not None:
            self._stop_counting(exc)

    def _stop_counting(self, exc: BaseException) -> None:
        if self.failed is None:
            self.failed = f"{type(exc).__name__}: {exc}"
            log.warning("keyword vocabulary: counting stopped (%s); the next run counts afresh", self.failed)

    async def _settled(self) -> None:
        """Wait for counting still in threads (a cancelled caller's); what failed there stops counting."""
        jobs = list(self._pending)
        if not jobs:
            return
        await asyncio.wait(jobs)  # never cancels them: a save must not start while one still counts
        await asyncio.sleep(0)  # their done callbacks (``_counted``) have run

    async def finish(self, embedder: Embedder, warnings: list[tuple[str, str]],
                     kept: KeptCounts | None = None) -> None:
        """Write the vocabulary when words were counted (or there is none yet), then let the next run have it
        (and ``kept`` the counts); a failure is a warning (appended to ``warnings``): search works without
        expansion, and the counts are deleted so that the next run counts afresh. Counting still in threads
        (a cancelled caller's) is waited for first. The writing and the end run in one thread that a
        cancelled caller does not stop: nothing is written after the lock is let go, and it is let go."""
        try:
            await self._settled()
        except BaseException:  # cancelled while counting went on: the counts cannot be saved whole, so they
            await _in_thread(self._end, True, True)  # are deleted (the next run counts afresh), lock let go
            raise
        await _in_thread(self._write, embedder, warnings, kept)

    def _write(self, embedder: Embedder, warnings: list[tuple[str, str]], kept: KeptCounts | None) -> None:
        kept_now = False
        try:
            if self.failed is not None:
                self._discard()
                warnings.append(("vocabulary", f"keyword-expansion counts dropped: {self.failed}"))
                return
            if self.counts.added or not self.existed:
                update_vocabulary(self.path, self.counts, self.sparse, embedder)
            if kept is not None:
                kept.keep(self.path, self.counts)
                kept_now = True
        except (*COUNTING_FAILS, EvidentError, RuntimeError) as exc:
            self._discard()
            warnings.append(("vocabulary", f"keyword-expansion vocabulary not updated: {exc}"))
        finally:
            self._end(not kept_now)

    def _end(self, retire: bool, discard: bool = False) -> None:
        """Let the next run have the vocabulary; with ``retire`` no later run uses these counts, and a change
        still coming (a cancelled caller's counting thread) is dropped; with ``discard`` they are deleted."""
        try:
            if retire:
                self.counts.retire()
            if discard:
                self._discard()
        finally:
            self.release()

    def _discard(self) -> None:
        self.counts.close()  # what was not saved is rolled back
        TermCounts.path_for(self.path).unlink(missing_ok=True)

    def release(self) -> None:
        """Close the counts (unsaved changes are rolled back) and let the next run have the vocabulary."""
        try:
            self.counts.close()
        finally:
            with contextlib.suppress(OSError):
                os.close(self.lock_fd)


async def _in_thread(work: Callable[..., None], *args: object) -> None:
    """``work`` in a thread that runs to its end: cancelled, the caller stops waiting, the thread goes on."""
    await asyncio.shield(asyncio.get_running_loop().run_in_executor(None, work, *args))


def _let_go(taking: asyncio.Future[VocabularyRun]) -> None:
    """A run whose start was cancelled after its thread took the lock: nobody finishes it."""
    if not taking.cancelled() and taking.exception() is None:
        taking.result()._end(True)
