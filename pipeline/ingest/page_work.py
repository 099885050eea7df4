"""A page's CPU work before embedding (``prepare_page``): parse and split it, contextualize its evidence,
BM25-encode the texts and count their words for the keyword vocabulary; and where that work runs
(``PageWork``).

``evident ingest`` and ``evident sync`` prepare pages in a thread of their own process (``ThreadPageWork``).
``evident serve``'s sync prepares them in a child process at a lower CPU priority
(``pipeline.ingest.page_worker``): in serve's own process that work held the GIL that questions being answered
need (answers' p99 during a sync 2.7-4.3x idle at 50,000 pages; parsing, BM25 and word counting were 65 % of
the GIL time serve's threads held; BENCHMARKS.md), and a thread cannot be given a lower priority than the
event loop beside it.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from pipeline.errors import EvidentError
from pipeline.ingest.contextualize import contextualize
from pipeline.ingest.split import PageEvidence, split_page
from pipeline.models.sparse import Bm25Encoder
from pipeline.models.term_counts import Contribution, TermCounts

if TYPE_CHECKING:  # not imported by serve's page worker process
    from pipeline.ingest.options import IngestOptions
    from pipeline.ingest.settings import IngestSettings
    from pipeline.protocols import SparseEncoder
    from pipeline.types import Page, SparseVector

# what encoding a page's texts can raise for that page alone (the batch's old failure set)
ENCODING_FAILS = (EvidentError, ValueError, RuntimeError, MemoryError, UnicodeError)


@dataclass
class PreparedPage:
    """A page ready to embed and write: its evidence and what was computed from it."""

    split: PageEvidence
    texts: list[str]  # contextualized: what the index stores and BM25 encodes ([] when only counted)
    dense_texts: list[str]  # what the dense model embeds
    sparse: list[SparseVector] | None  # None: the caller encodes (a sparse encoder the worker does not hold)
    words: Contribution | None  # the texts' words for the keyword vocabulary (None: not counted)


Outcome = tuple[PreparedPage | None, str, float]  # (the prepared page, else why it failed; seconds)


def prepare_page(page: Page, options: IngestOptions, *, encode: bool, bm25: Bm25Encoder | None,
                 count: bool) -> Outcome:
    """``page`` split, and when ``encode`` its texts contextualized and (with ``bm25``) encoded; when
    ``count`` (needs ``bm25``) its words counted. Never raises: a failure is this page's reason."""
    start = time.perf_counter()
    try:
        split = split_page(page, options)
    except EvidentError as exc:
        return None, str(exc), time.perf_counter() - start
    except (RecursionError, MemoryError) as exc:
        return None, f"too complex to parse ({type(exc).__name__})", time.perf_counter() - start
    except Exception as exc:  # noqa: BLE001 - a parser bug on one page must not abort the run
        return None, f"could not be parsed ({type(exc).__name__}: {exc})", time.perf_counter() - start
    try:
        texts, dense, sparse = _encoded(split, options, bm25) if encode else ([], [], None)
    except ENCODING_FAILS as exc:
        return None, f"embedding failed: {exc}", time.perf_counter() - start
    words: Contribution | None = None
    if count and bm25 is not None:
        try:
            words = TermCounts.contribution((ev.text for ev in split.evidence), bm25)
        except (ValueError, MemoryError, UnicodeError):
            words = None  # the caller counts them itself, where a failure stops counting, not the page
    return PreparedPage(split, texts, dense, sparse, words), "", time.perf_counter() - start


def _encoded(split: PageEvidence, options: IngestOptions, bm25: Bm25Encoder | None
             ) -> tuple[list[str], list[str], list[SparseVector] | None]:
    bound = options.context_item_max_chars
    texts = [contextualize(ev, options.context_items, bound) for ev in split.evidence]
    dense = texts if options.dense_context_items is None else [
        contextualize(ev, options.dense_context_items, bound) for ev in split.evidence
    ]
    return texts, dense, None if bm25 is None else bm25.encode_documents(texts)


class PageWork(Protocol):
    """Where pages are prepared (``prepare_page``); one page at a time."""

    async def prepare(self, page: Page, options: IngestOptions, *, encode: bool, count: bool) -> Outcome:
        """``prepare_page`` of ``page`` (``count``: only when the sparse encoder is BM25)."""
        ...

    async def close(self) -> None: ...


class ThreadPageWork:
    """Pages prepared in a thread of this process (``evident ingest``, ``evident sync``)."""

    def __init__(self, sparse: SparseEncoder) -> None:
        self._bm25 = sparse if isinstance(sparse, Bm25Encoder) else None

    async def prepare(self, page: Page, options: IngestOptions, *, encode: bool, count: bool) -> Outcome:
        return await asyncio.to_thread(prepare_page, page, options, encode=encode, bm25=self._bm25,
                                       count=count)

    async def close(self) -> None:
        return None


def make_page_work(ingest: IngestSettings, sparse: SparseEncoder, *, serving: bool = False) -> PageWork:
    """Where pages are prepared: a worker process at a lower CPU priority when ``EVIDENT_PAGE_PROCESS`` says
    so (``auto``: for ``serving`` processes), else a thread. The caller closes it."""
    if ingest.page_process == "yes" or (ingest.page_process == "auto" and serving):
        from pipeline.ingest.page_worker import ProcessPageWork

        return ProcessPageWork(sparse, nice=ingest.page_process_nice)
    return ThreadPageWork(sparse)
