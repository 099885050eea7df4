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
from pipeline.errors import EvidentError, InputError
from pipeline.ingest.contextualize import contextualize
from pipeline.ingest.evidence import build_evidence
from pipeline.ingest.options import IngestOptions
from pipeline.ingest.report import IngestReport
from pipeline.ingest.storage import parse_page
from pipeline.ingest.vocabulary_run import VocabularyRun
from pipeline.protocols import Embedder, Index, SparseEncoder
from pipeline.runtime.foreground import StepAside, go_on
from pipeline.types import Evidence, IndexPoint, Page, SparseVector

SPARSE_STEP = 64  # texts BM25-encoded in one go (ConfQuestions evidence: 11.5 ms p50, a busy 2-core machine)


@dataclass
class PageEvidence:
    """One page split into evidence, with what happened on the way."""

    evidence: list[Evidence]
    lost: list[str] = field(default_factory=list)  # text not indexed (partial page)
    recovered: list[str] = field(default_factory=list)  # informational


def page_hash(page: Page, fingerprint: str) -> str:
    """Content hash of a page version under one indexing configuration."""
    h = hashlib.sha256()
    for part in (fingerprint, page.title, page.url, page.space, " › ".join(page.ancestors), page.body):
        h.update(part.encode("utf-8", "surrogatepass"))
        h.update(b"\x00")
    return h.hexdigest()[:32]


def page_to_evidence(page: Page, options: IngestOptions) -> list[Evidence]:
    """Parse and split one page. Raises ``EvidentError`` subclasses for unusable pages."""
    return split_page(page, options).evidence


def split_page(page: Page, options: IngestOptions) -> PageEvidence:
    """Parse and split one page within its bounds; ``EvidentError`` for a page that cannot be indexed."""
    size = len(page.body.encode("utf-8", "surrogatepass"))
    if size > options.max_page_bytes:
        raise InputError(
            f"page is too large ({size / 2**20:.1f} MiB > {options.max_page_bytes / 2**20:.1f} MiB limit)"
        )
    if not page.body.strip():
        raise InputError("page has no content")
    parsed = parse_page(page.body, page_id=page.id, limits=options.parse)
    notes: list[str] = []
    evidence = build_evidence(page, parsed.elements, table_indexing=options.table_indexing,
                              linearization=options.linearization, max_chars=options.max_evidence_chars,
                              notes=notes)
    if not evidence:
        raise InputError("page has no text content")
    result = PageEvidence(evidence, lost=notes, recovered=list(parsed.notes))
    if parsed.low_coverage(options.parse):
        result.lost.append(f"only {parsed.coverage:.0%} of the page's visible text could be read "
                           f"({parsed.mode} parse)")
    _cap_evidence(result, options.max_evidence_per_page)
    return result


def _cap_evidence(result: PageEvidence, cap: int) -> None:
    """At most ``cap`` evidence: rows go first (their tables keep the text), then the page's tail."""
    n = len(result.evidence)
    if n <= cap:
        return
    rows = sum(1 for e in result.evidence if e.kind == "row")
    drop_rows = min(rows, n - cap)
    if drop_rows:
        kept: list[Evidence] = []
        dropped = 0
        for e in reversed(result.evidence):
            if e.kind == "row" and dropped < drop_rows:
                dropped += 1
                continue
            kept.append(e)
        result.evidence = kept[::-1]
        result.recovered.append(
            f"{drop_rows} table rows not indexed one by one (EVIDENT_MAX_EVIDENCE_PER_PAGE "
            f"{cap}); their tables are indexed whole"
        )
    if len(result.evidence) > cap:
        result.lost.append(f"only the first {cap} of {len(result.evidence)} evidence indexed "
                           "(EVIDENT_MAX_EVIDENCE_PER_PAGE)")
        result.evidence = result.evidence[:cap]


@dataclass
class _Pending:
    page: Page
    hash: str
    existed: bool
    evidence: list[Evidence]


async def _aiter(pages: AsyncIterable[Page] | Iterable[Page]) -> AsyncIterator[Page]:
    if isinstance(pages, AsyncIterable):
        async for p in pages:
            yield p
    else:
        for p in pages:
            yield p


def _split_isolated(page: Page, options: IngestOptions) -> tuple[PageEvidence | None, str, float]:
    """``split_page`` that never raises: (result, failure reason, seconds)."""
    start = time.perf_counter()
    try:
        return split_page(page, options), "", time.perf_counter() - start
    except EvidentError as exc:
        return None, str(exc), time.perf_counter() - start
    except (RecursionError, MemoryError) as exc:
        return None, f"too complex to parse ({type(exc).__name__})", time.perf_counter() - start
    except Exception as exc:  # noqa: BLE001 - a parser bug on one page must not abort the run
        return None, f"could not be parsed ({type(exc).__name__}: {exc})", time.perf_counter() - start


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
) -> IngestReport:
    """Index ``pages``; returns what happened. A failing page is reported and skipped, never fatal.
    ``vocabulary``, ``count_unchanged``: the keyword-expansion vocabulary kept up to date (``VocabularyRun``):
    a path is loaded and saved by this run; a ``VocabularyRun`` belongs to the caller (one for a whole sync),
    who finishes it. ``step_aside``: awaited before each page's parsing, a batch's encoding and each page's
    write (``evident serve``'s sync steps aside for questions being answered). ``live``: the index's page
    hashes when the caller holds them (a sync reads them once a cycle, not once for each space: a read of the
    whole page table, which a question's search waits behind); kept current here as pages are written."""
    t0 = time.perf_counter()
    if isinstance(vocabulary, VocabularyRun):
        return await _ingest(pages, index=index, embedder=embedder, sparse=sparse, options=options,
                             progress=progress, words=vocabulary, pause=step_aside or go_on, live=live)
    warnings: list[tuple[str, str]] = []
    async with VocabularyRun.held(vocabulary, sparse, count_unchanged, embedder, warnings) as words:
        report = await _ingest(pages, index=index, embedder=embedder, sparse=sparse, options=options,
                               progress=progress, words=words, pause=step_aside or go_on, live=live)
    report.warnings.extend(warnings)
    report.seconds = time.perf_counter() - t0
    return report


async def _ingest(pages: AsyncIterable[Page] | Iterable[Page], *, index: Index, embedder: Embedder,
                  sparse: SparseEncoder, options: IngestOptions, progress: bool,
                  words: VocabularyRun | None, pause: StepAside, live: dict[str, str] | None) -> IngestReport:
    t0 = time.perf_counter()
    report = IngestReport()
    kinds: Counter[str] = Counter()
    fingerprint = options.fingerprint(embedder.name, sparse.name)
    live = await index.page_hashes() if live is None else live
    pending: list[_Pending] = []
    pending_n = 0
    bar = _progress_bar(progress)
    access: dict[str, PageAccess] = {}  # unchanged pages' permissions: written without re-embedding

    async def flush() -> None:
        nonlocal pending, pending_n
        if not pending:
            return
        batch, pending, pending_n = pending, [], 0
        await _embed_and_write(batch, index=index, embedder=embedder, sparse=sparse, options=options,
                               report=report, kinds=kinds, words=words, pause=pause, live=live)
        if bar is not None:
            bar.update(sum(len(p.evidence) for p in batch))
    async for page in _aiter(pages):
        report.pages_seen += 1
        h = page_hash(page, fingerprint)
        await pause()
        if live.get(page.id) == h:
            await _unchanged(page, report, access, words, options)
            continue
        result = await _split_reported(page, options, report)
        if result is None:
            continue
        pending.append(_Pending(page, h, page.id in live, result.evidence))
        pending_n += len(result.evidence)
        if bar is not None:
            bar.total = (bar.total or 0) + len(result.evidence)
            bar.refresh()
        if pending_n >= options.batch_evidence:
            await flush()
    await flush()
    if bar is not None:
        bar.close()
    if access and await index.missing_access():  # an index built before permissions: give them now
        await index.set_access(access)
    if report.added or report.updated:
        await index.optimize()  # the segments this run filled get their HNSW graph and quantization
    report.evidence_by_kind = dict(sorted(kinds.items()))
    report.seconds = time.perf_counter() - t0
    return report


async def _unchanged(page: Page, report: IngestReport, access: dict[str, PageAccess],
                     words: VocabularyRun | None, options: IngestOptions) -> None:
    """A page already indexed at this version: counted, its permissions kept for a payload write where the
    index
    has evidence without any (a sync writes changed ones itself), its words counted while the vocabulary is
    bootstrapped."""
    report.unchanged += 1
    if page.access is not None:
        access[page.id] = page.access
    if words is not None and words.bootstrap:
        result, _, _ = await asyncio.to_thread(_split_isolated, page, options)
        if result is not None:
            await words.count([(page.id, [ev.text for ev in result.evidence])])


async def _split_reported(page: Page, options: IngestOptions, report: IngestReport) -> PageEvidence | None:
    """The page's evidence (off the event loop), its failure, losses, recoveries and time in ``report``."""
    result, reason, seconds = await asyncio.to_thread(_split_isolated, page, options)
    if seconds > report.slowest_page[1]:
        report.slowest_page = (page.id, seconds)
    if result is None:
        report.failed.append((page.id, reason))
        return None
    report.partial.extend((page.id, why) for why in result.lost)
    report.warnings.extend((page.id, why) for why in result.recovered)
    return result


def _progress_bar(enabled: bool) -> Any:
    """Evidence embedded out of the evidence found so far (pages are streamed, so the total grows)."""
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(desc="embedding", unit="evidence", total=0, dynamic_ncols=True)


async def _embed_and_write(
    batch: Sequence[_Pending],
    *,
    index: Index,
    embedder: Embedder,
    sparse: SparseEncoder,
    options: IngestOptions,
    report: IngestReport,
    kinds: Counter[str],
    words: VocabularyRun | None = None,
    pause: StepAside = go_on,
    live: dict[str, str],
) -> None:
    await pause()
    encoded = await _encode(batch, embedder=embedder, sparse=sparse, options=options, pause=pause)
    if words is not None and encoded is not None:
        await pause()
        await words.count([(item.page.id, [ev.text for ev in item.evidence]) for item in batch])
    if encoded is None:  # the batch failed as a whole: find the page(s) at fault one by one
        for item in batch:
            await pause()
            single = await _encode([item], embedder=embedder, sparse=sparse, options=options, report=report)
            if single is not None:
                await _write(item, *single, index=index, report=report, kinds=kinds, live=live)
        return
    texts, dense, sparse_vecs = encoded
    start = 0
    for item in batch:
        end = start + len(item.evidence)
        await pause()
        await _write(item, texts[start:end], dense[start:end], sparse_vecs[start:end], index=index,
                     report=report, kinds=kinds, live=live)
        start = end


async def _encode(
    batch: Sequence[_Pending], *, embedder: Embedder, sparse: SparseEncoder, options: IngestOptions,
    report: IngestReport | None = None, pause: StepAside = go_on,
) -> tuple[list[str], Any, list[SparseVector]] | None:
    """Contextualized texts, dense and sparse vectors of a batch; None (or a failure per page) on error."""
    try:
        evidence = [ev for item in batch for ev in item.evidence]
        texts = [contextualize(ev, options.context_items, options.context_item_max_chars) for ev in evidence]
        dense_texts = texts if options.dense_context_items is None else [
            contextualize(ev, options.dense_context_items, options.context_item_max_chars) for ev in evidence
        ]
        dense = await asyncio.to_thread(embedder.embed_documents, dense_texts)
        sparse_vecs: list[SparseVector] = []
        for start in range(0, len(texts), SPARSE_STEP):  # BM25 is Python: in steps a question can go between
            if start:
                await pause()
            step = texts[start : start + SPARSE_STEP]
            sparse_vecs += await asyncio.to_thread(sparse.encode_documents, step)
        if len(dense) != len(texts) or len(sparse_vecs) != len(texts):
            raise EvidentError(
                f"got {len(dense)} dense and {len(sparse_vecs)} sparse vectors for {len(texts)} texts"
            )
        return texts, dense, sparse_vecs
    except (EvidentError, ValueError, RuntimeError, MemoryError, UnicodeError) as exc:
        if report is not None:
            report.failed.extend((item.page.id, f"embedding failed: {exc}") for item in batch)
        return None


async def _write(item: _Pending, texts: Sequence[str], dense: Any, sparse_vecs: Sequence[SparseVector], *,
                 index: Index, report: IngestReport, kinds: Counter[str], live: dict[str, str]) -> None:
    """Swap the page's new version in; ``live`` follows (a failed swap may leave the page absent: never
    taken for unchanged later)."""
    points = [
        IndexPoint(ev, texts[i], tuple(float(x) for x in dense[i]), sparse_vecs[i], item.hash)
        for i, ev in enumerate(item.evidence)
    ]
    try:
        await index.replace_page(item.page.id, item.hash, points)
    except EvidentError as exc:
        live.pop(item.page.id, None)
        report.failed.append((item.page.id, f"index write failed: {exc}"))
        return
    live[item.page.id] = item.hash
    if item.existed:
        report.updated += 1
    else:
        report.added += 1
    kinds.update(ev.kind for ev in item.evidence)
