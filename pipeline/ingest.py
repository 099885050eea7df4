"""Pages -> evidence -> vectors -> index, page by page, never leaving a page half-written.

Embedding is the slow stage, so evidence of several pages is embedded in one batch; each page is then
swapped into the index as a unit (``Index.replace_page``). Unchanged pages (same content hash under
the same indexing configuration) are skipped without parsing or embedding.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections import Counter
from collections.abc import AsyncIterable, Iterable, Sequence
from dataclasses import dataclass, field

from pipeline.contextualize import contextualize
from pipeline.errors import EvidentError, InputError
from pipeline.evidence import build_evidence
from pipeline.protocols import Embedder, Index, SparseEncoder
from pipeline.storage_format import parse_storage
from pipeline.types import Evidence, IndexPoint, Page


@dataclass(frozen=True)
class IngestOptions:
    """Everything that changes what gets indexed; part of every page's content hash."""

    context_items: tuple[str, ...] = ("title", "heading", "before", "after")
    context_item_max_chars: int = 300
    # Context for the dense text, when it should differ from the lexical one: the dense model reads only
    # its first ~128 tokens, so long neighbours can push the evidence itself out of its window.
    dense_context_items: tuple[str, ...] | None = None
    table_indexing: str = "both"
    linearization: str = "verbalized"  # table rows: verbalized | markdown | plain
    max_page_bytes: int = 4 * 1024 * 1024
    batch_evidence: int = 256  # evidence embedded per batch (across pages)

    def fingerprint(self, embedder: str, sparse: str) -> str:
        cfg = {
            "context_items": list(self.context_items),
            "context_item_max_chars": self.context_item_max_chars,
            "dense_context_items": None if self.dense_context_items is None else list(self.dense_context_items),
            "table_indexing": self.table_indexing,
            **({"linearization": self.linearization} if self.linearization != "verbalized" else {}),
            "embedder": embedder,
            "sparse": sparse,
        }
        return hashlib.sha256(json.dumps(cfg, sort_keys=True).encode()).hexdigest()[:16]


@dataclass
class IngestReport:
    pages_seen: int = 0
    added: int = 0
    updated: int = 0
    unchanged: int = 0
    failed: list[tuple[str, str]] = field(default_factory=list)  # (page id, reason)
    evidence_by_kind: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def evidence(self) -> int:
        return sum(self.evidence_by_kind.values())


def page_hash(page: Page, fingerprint: str) -> str:
    """Content hash of a page version under one indexing configuration."""
    h = hashlib.sha256()
    for part in (fingerprint, page.title, page.url, page.space, " › ".join(page.ancestors), page.body):
        h.update(part.encode("utf-8", "surrogatepass"))
        h.update(b"\x00")
    return h.hexdigest()[:32]


def page_to_evidence(page: Page, options: IngestOptions) -> list[Evidence]:
    """Parse and split one page. Raises ``EvidentError`` subclasses for unusable pages."""
    size = len(page.body.encode("utf-8", "surrogatepass"))
    if size > options.max_page_bytes:
        raise InputError(
            f"page is too large ({size / 2**20:.1f} MiB > {options.max_page_bytes / 2**20:.1f} MiB limit)"
        )
    if not page.body.strip():
        raise InputError("page has no content")
    elements = parse_storage(page.body, page_id=page.id)
    evidence = build_evidence(page, elements, table_indexing=options.table_indexing,
                              linearization=options.linearization)
    if not evidence:
        raise InputError("page has no text content")
    return evidence


@dataclass
class _Pending:
    page: Page
    hash: str
    existed: bool
    evidence: list[Evidence]


async def _aiter(pages: AsyncIterable[Page] | Iterable[Page]):  # type: ignore[no-untyped-def]
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
) -> IngestReport:
    """Index ``pages``; returns what happened. A failing page is reported and skipped, never fatal."""
    t0 = time.perf_counter()
    report = IngestReport()
    kinds: Counter[str] = Counter()
    fingerprint = options.fingerprint(embedder.name, sparse.name)
    live = await index.page_hashes()
    pending: list[_Pending] = []
    pending_n = 0
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(desc="ingest", unit="page")

    async def flush() -> None:
        nonlocal pending, pending_n
        if not pending:
            return
        batch, pending, pending_n = pending, [], 0
        await _embed_and_write(batch, index=index, embedder=embedder, sparse=sparse, options=options,
                               report=report, kinds=kinds)

    async for page in _aiter(pages):
        report.pages_seen += 1
        if bar is not None:
            bar.update(1)
        h = page_hash(page, fingerprint)
        if live.get(page.id) == h:
            report.unchanged += 1
            continue
        try:
            evidence = await asyncio.to_thread(page_to_evidence, page, options)
        except EvidentError as exc:
            report.failed.append((page.id, str(exc)))
            continue
        except Exception as exc:  # noqa: BLE001 - a parser bug on one page must not abort the run
            report.failed.append((page.id, f"could not be parsed ({type(exc).__name__}: {exc})"))
            continue
        pending.append(_Pending(page, h, page.id in live, evidence))
        pending_n += len(evidence)
        if pending_n >= options.batch_evidence:
            await flush()
    await flush()
    if bar is not None:
        bar.close()
    report.evidence_by_kind = dict(sorted(kinds.items()))
    report.seconds = time.perf_counter() - t0
    return report


async def _embed_and_write(
    batch: Sequence[_Pending],
    *,
    index: Index,
    embedder: Embedder,
    sparse: SparseEncoder,
    options: IngestOptions,
    report: IngestReport,
    kinds: Counter[str],
) -> None:
    texts = [
        contextualize(ev, options.context_items, options.context_item_max_chars)
        for item in batch
        for ev in item.evidence
    ]
    if options.dense_context_items is None:
        dense_texts = texts
    else:
        dense_texts = [
            contextualize(ev, options.dense_context_items, options.context_item_max_chars)
            for item in batch
            for ev in item.evidence
        ]
    dense = await asyncio.to_thread(embedder.embed_documents, dense_texts)
    sparse_vecs = await asyncio.to_thread(sparse.encode_documents, texts)
    i = 0
    for item in batch:
        points = []
        for ev in item.evidence:
            points.append(IndexPoint(ev, texts[i], tuple(float(x) for x in dense[i]), sparse_vecs[i], item.hash))
            i += 1
        try:
            await index.replace_page(item.page.id, item.hash, points)
        except EvidentError as exc:
            report.failed.append((item.page.id, f"index write failed: {exc}"))
            continue
        if item.existed:
            report.updated += 1
        else:
            report.added += 1
        kinds.update(ev.kind for ev in item.evidence)
