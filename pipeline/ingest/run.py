"""Pages -> evidence -> vectors -> index, page by page: a bad page is reported, never fatal, never
half-written.

Embedding is the slow stage, so evidence of several pages is embedded in one batch; each page is then
swapped into the index as a unit (``Index.replace_page``). Unchanged pages (same content hash under
the same indexing configuration) are skipped without parsing or embedding.

Every stage is isolated per page: a page that fails to parse, contextualize, embed, sparse-encode or
write is reported with a one-line reason (``IngestReport.failed``) and every other page proceeds; a
batch whose embedding fails is retried page by page. A page indexed with less than all of its text
(bounds, low parse coverage) is listed in ``partial``; what was recovered without loss in ``warnings``.
Bounds per page (``IngestOptions``, docs/ingest.md): size, parse time, markup depth, table size,
evidence length and count.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections import Counter
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.access.scope import PageAccess
from pipeline.errors import EvidentError
from pipeline.ingest.options import IngestOptions
from pipeline.ingest.page_work import ENCODING_FAILS, PageWork, PreparedPage, ThreadPageWork
from pipeline.ingest.report import IngestReport
from pipeline.ingest.split import PageEvidence, page_to_evidence, split_page
from pipeline.ingest.vocabulary_run import VocabularyRun
from pipeline.protocols import Embedder, Index, SparseEncoder
from pipeline.runtime.foreground import StepAside, go_on
from pipeline.types import Evidence, IndexPoint, Page, SparseVector

__all__ = ["PageEvidence", "ingest_pages", "page_hash", "page_to_evidence", "split_page"]

SPARSE_STEP = 64  # texts BM25-encoded in one go (ConfQuestions evidence: 11.5 ms p50, a busy 2-core machine)


def page_hash(page: Page, fingerprint: str) -> str:
    """Content hash of a page version under one indexing configuration."""
    h = hashlib.sha256()
    for part in (fingerprint, page.title, page.url, page.space, " › ".join(page.ancestors), page.body):
        h.update(part.encode("utf-8", "surrogatepass"))
        h.update(b"\x00")
    return h.hexdigest()[:32]


@dataclass
class _Pending:
    page: Page
    hash: str
    existed: bool
    prepared: PreparedPage

    @property
    def evidence(self) -> list[Evidence]:
        return self.prepared.split.evidence


async def _aiter(pages: AsyncIterable[Page] | Iterable[Page]) -> AsyncIterator[Page]:
    if isinstance(pages, AsyncIterable):
        async for p in pages:
            yield p
    else:
        for p in pages:
            yield p


async def ingest_pages(
    pages: AsyncIterable[Page] | Iterable[Page],
    *,
    index: Index,
    embedder: Embedder,
    sparse: SparseEncoder,
    options: IngestOptions,
    progress: bool = False,
    vocabulary: Path | VocabularyRun | None = None,
    count_unchanged: bool | None = None,
    step_aside: StepAside | None = None,
    live: dict[str, str] | None = None,
    work: PageWork | None = None,
) -> IngestReport:
    """Index ``pages``; returns what happened. A failing page is reported and skipped, never fatal.
    ``vocabulary``, ``count_unchanged``: the keyword-expansion vocabulary kept up to date (``VocabularyRun``):
    a path is loaded and saved by this run; a ``VocabularyRun`` belongs to the caller (one for a whole sync),
    who finishes it. ``step_aside``: awaited before each page's parsing, a batch's encoding and each page's
    write (``evident serve``'s sync steps aside for questions being answered). ``live``: the index's page
    hashes when the caller holds them (a sync reads them once a cycle, not once for each space: a read of the
    whole page table, which a question's search waits behind); kept current here as pages are written.
    ``work``: where pages are parsed, encoded and counted (``pipeline.ingest.page_work``; default: a thread
    of this process); it belongs to the caller."""
    t0 = time.perf_counter()
    run = _Run(index, embedder, sparse, options, IngestReport(), work or ThreadPageWork(sparse),
               pause=step_aside or go_on)
    if isinstance(vocabulary, VocabularyRun):
        run.words = vocabulary
        return await _ingest(pages, run, progress=progress, live=live)
    warnings: list[tuple[str, str]] = []
    async with VocabularyRun.held(vocabulary, sparse, count_unchanged, embedder, warnings) as words:
        run.words = words
        report = await _ingest(pages, run, progress=progress, live=live)
    report.warnings.extend(warnings)
    report.seconds = time.perf_counter() - t0
    return report


@dataclass
class _Run:
    """What every step of one ingest run works with."""

    index: Index
    embedder: Embedder
    sparse: SparseEncoder
    options: IngestOptions
    report: IngestReport
    work: PageWork
    pause: StepAside = go_on
    words: VocabularyRun | None = None
    live: dict[str, str] = field(default_factory=dict)  # the index's page hashes, kept current
    kinds: Counter[str] = field(default_factory=Counter)


async def _ingest(pages: AsyncIterable[Page] | Iterable[Page], run: _Run, *, progress: bool,
                  live: dict[str, str] | None) -> IngestReport:
    t0 = time.perf_counter()
    report = run.report
    fingerprint = run.options.fingerprint(run.embedder.name, run.sparse.name)
    run.live = await run.index.page_hashes() if live is None else live
    pending: list[_Pending] = []
    pending_n = 0
    bar = _progress_bar(progress)
    access: dict[str, PageAccess] = {}  # unchanged pages' permissions: written without re-embedding

    async def flush() -> None:
        nonlocal pending, pending_n
        if not pending:
            return
        batch, pending, pending_n = pending, [], 0
        await _embed_and_write(batch, run)
        if bar is not None:
            bar.update(sum(len(p.evidence) for p in batch))
    async for page in _aiter(pages):
        report.pages_seen += 1
        h = page_hash(page, fingerprint)
        await run.pause()
        if run.live.get(page.id) == h:
            await _unchanged(page, run, access)
            continue
        prepared = await _prepared(page, run)
        if prepared is None:
            continue
        pending.append(_Pending(page, h, page.id in run.live, prepared))
        pending_n += len(prepared.split.evidence)
        if bar is not None:
            bar.total = (bar.total or 0) + len(prepared.split.evidence)
            bar.refresh()
        if pending_n >= run.options.batch_evidence:
            await flush()
    await flush()
    if bar is not None:
        bar.close()
    if access and await run.index.missing_access():  # an index built before permissions: give them now
        await run.index.set_access(access)
    if report.added or report.updated:
        await run.index.optimize()  # the segments this run filled get their HNSW graph and quantization
    report.evidence_by_kind = dict(sorted(run.kinds.items()))
    report.seconds = time.perf_counter() - t0
    return report


async def _unchanged(page: Page, run: _Run, access: dict[str, PageAccess]) -> None:
    """A page already indexed at this version: counted, its permissions kept for a payload write where the
    index has evidence without any (a sync writes changed ones itself), its words counted while the vocabulary
    is bootstrapped."""
    run.report.unchanged += 1
    if page.access is not None:
        access[page.id] = page.access
    if run.words is not None and run.words.bootstrap and run.words.failed is None:
        prepared, _, _ = await run.work.prepare(page, run.options, encode=False, count=True)
        if prepared is not None:
            await _count(page.id, prepared, run.words)


async def _prepared(page: Page, run: _Run) -> PreparedPage | None:
    """The page parsed, encoded and counted (by ``run.work``); its failure, losses, recoveries and time in the
    report."""
    report = run.report
    counting = run.words is not None and run.words.failed is None
    prepared, reason, seconds = await run.work.prepare(page, run.options, encode=True, count=counting)
    if seconds > report.slowest_page[1]:
        report.slowest_page = (page.id, seconds)
    if prepared is None:
        report.failed.append((page.id, reason))
        return None
    report.partial.extend((page.id, why) for why in prepared.split.lost)
    report.warnings.extend((page.id, why) for why in prepared.split.recovered)
    return prepared


def _progress_bar(enabled: bool) -> Any:
    """Evidence embedded out of the evidence found so far (pages are streamed, so the total grows)."""
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(desc="embedding", unit="evidence", total=0, dynamic_ncols=True)


async def _embed_and_write(batch: Sequence[_Pending], run: _Run) -> None:
    """Embed the batch (page by page when the batch fails as a whole, to find the page(s) at fault) and
    write each page."""
    await run.pause()
    encoded = await _encode(batch, run)
    if encoded is None:
        for item in batch:
            await run.pause()
            single = await _encode([item], run, report=True)
            if single is not None:
                await _write(item, *single, run=run)
        return
    dense, sparse_vecs = encoded
    start = 0
    for item in batch:
        end = start + len(item.evidence)
        await run.pause()
        await _write(item, dense[start:end], sparse_vecs[start:end], run=run)
        start = end


async def _count(page_id: str, prepared: PreparedPage, words: VocabularyRun) -> None:
    """A written page's words into the vocabulary's counts: as counted where it was prepared, else (a sparse
    encoder the page worker could not rebuild) counted here."""
    if prepared.words is not None:
        await words.counted([(page_id, prepared.words, len(prepared.split.evidence))])
    else:
        await words.count([(page_id, [ev.text for ev in prepared.split.evidence])])


async def _encode(batch: Sequence[_Pending], run: _Run, *, report: bool = False
                  ) -> tuple[Any, list[SparseVector]] | None:
    """Dense and sparse vectors of a batch's texts (sparse ones as prepared, else encoded here); None on
    error, each page of the batch then failed when ``report``."""
    try:
        dense = await asyncio.to_thread(run.embedder.embed_documents,
                                        [t for item in batch for t in item.prepared.dense_texts])
        sparse_vecs: list[SparseVector] = []
        for item in batch:
            if item.prepared.sparse is not None:
                sparse_vecs += item.prepared.sparse
                continue
            texts = item.prepared.texts
            for start in range(0, len(texts), SPARSE_STEP):  # in steps a question can go between
                await run.pause()
                step = texts[start : start + SPARSE_STEP]
                sparse_vecs += await asyncio.to_thread(run.sparse.encode_documents, step)
        n = sum(len(item.evidence) for item in batch)
        if len(dense) != n or len(sparse_vecs) != n:
            raise EvidentError(f"got {len(dense)} dense and {len(sparse_vecs)} sparse vectors for {n} texts")
        return dense, sparse_vecs
    except ENCODING_FAILS as exc:
        if report:
            run.report.failed.extend((item.page.id, f"embedding failed: {exc}") for item in batch)
        return None


async def _write(item: _Pending, dense: Any, sparse_vecs: Sequence[SparseVector], *, run: _Run) -> None:
    """Swap the page's new version in and count its words; ``run.live`` follows (a failed swap may leave the
    page absent: never taken for unchanged later; it is reported)."""
    texts = item.prepared.texts
    # an array's rows as Python floats in one C call a page (not one float() a number: 4 % of serve's GIL)
    rows = dense.tolist() if hasattr(dense, "tolist") else [[float(x) for x in row] for row in dense]
    points = [IndexPoint(ev, texts[i], tuple(rows[i]), sparse_vecs[i], item.hash)
              for i, ev in enumerate(item.evidence)]
    try:
        await run.index.replace_page(item.page.id, item.hash, points)
    except EvidentError as exc:
        run.live.pop(item.page.id, None)
        run.report.failed.append((item.page.id, f"index write failed: {exc}"))
        return
    run.live[item.page.id] = item.hash
    if item.existed:
        run.report.updated += 1
    else:
        run.report.added += 1
    run.kinds.update(ev.kind for ev in item.evidence)
    if run.words is not None:  # at once: a run stopped later has counted every page it wrote
        await _count(item.page.id, item.prepared, run.words)
