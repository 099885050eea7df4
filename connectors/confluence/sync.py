"""Incremental Confluence -> index sync with deletions and per-space checkpoints.

Per space: (1) list the ids currently in scope (cheap, no bodies) and delete indexed pages of that
space that are gone, archived, restricted or out of scope; (2) stream the pages modified since the
checkpoint (minus the overlap, see ``connectors.confluence.cql``) into ``pipeline.ingest.run``; (3) move
the checkpoint to the newest ``lastmodified`` that is safely behind us.

"Safely behind us": pages arrive oldest edit first, so the checkpoint is the newest ``lastmodified``
of the pages before the first page that failed in a retryable way (an index write or embedding, or a results
page the API would not serve after retries). Pages after a failure are re-read next time, and
ingest's content hashes make that cheap. Content failures (an empty or unparsable page version) do
not hold the checkpoint back: only an edit can fix them, and an edit is seen by the next sync. When
offset paging proves unstable (the same page served twice because it was edited mid-sync, which
shifts offsets and may hide another page), the checkpoint is not advanced at all.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from connectors.confluence.cql import parse_utc, since_bound, to_utc_iso
from connectors.confluence.source import ConfluenceSource, SourceStats
from pipeline.errors import ConfigError, RemoteError
from pipeline.ingest.run import ingest_pages
from pipeline.protocols import CheckpointStore, Embedder, Index, SparseEncoder
from pipeline.types import Page

if TYPE_CHECKING:
    from pipeline.ingest.run import IngestOptions

# Failures that another try may fix (a transient embedder or index): the checkpoint waits for them.
RETRYABLE_INGEST_PREFIXES = ("index write failed", "embedding failed")


@dataclass
class SyncReport:
    added: int = 0
    updated: int = 0
    deleted: int = 0
    unchanged: int = 0
    skipped_restricted: int = 0
    failed: list[tuple[str, str]] = field(default_factory=list)  # (page id or "space:KEY", reason)
    partial: list[tuple[str, str]] = field(default_factory=list)  # indexed without all of their text
    warnings: list[tuple[str, str]] = field(default_factory=list)  # indexed in full after a recovery
    api_calls: int = 0
    seconds: float = 0.0
    pages_seen: int = 0
    checkpoints: dict[str, str | None] = field(default_factory=dict)  # space -> checkpoint after the run


@dataclass
class _Tracker:
    """Remembers what was handed to ingest, in order, and whether fetching stopped early."""

    seen: list[tuple[str, str | None]] = field(default_factory=list)
    fetch_error: RemoteError | None = None

    async def wrap(self, pages: AsyncIterator[Page]) -> AsyncIterator[Page]:
        try:
            async for page in pages:
                self.seen.append((page.id, page.updated))
                yield page
        except RemoteError as exc:  # retries exhausted: stop here, keep what was ingested
            self.fetch_error = exc

    def checkpoint(self, blocking: set[str], old: str | None) -> str | None:
        ids = [pid for pid, _ in self.seen]
        if len(ids) != len(set(ids)):
            return old  # unstable paging: a page moved while we paged
        best = parse_utc(old) if old else None
        for pid, updated in self.seen:
            if pid in blocking:
                break
            if updated:
                t = parse_utc(updated)
                best = t if best is None or t > best else best
        return to_utc_iso(best.isoformat()) if best else old


async def sync_confluence(
    *,
    source: ConfluenceSource,
    index: Index,
    embedder: Embedder,
    sparse: SparseEncoder,
    store: CheckpointStore,
    options: IngestOptions,
    full: bool = False,
    spaces: Sequence[str] | None = None,
    progress: bool = False,
) -> SyncReport:
    """Sync ``spaces`` (default: the source's) into ``index``; ``full`` ignores checkpoints.

    Raises ``NotFoundError``/``AuthError``/``UnreachableError`` up front for a wrong space key, bad
    credentials or base URL; later per-page and per-space failures are reported, not raised.
    """
    t0 = time.perf_counter()
    calls0 = source.client.api_calls
    keys = tuple(dict.fromkeys(spaces or source.spaces))
    if not keys:
        raise ConfigError("no Confluence spaces to sync: set CONFLUENCE_SPACES")
    report = SyncReport()
    for key in keys:
        await source.check_space(key)
    source.stats = SourceStats()  # counts are per run

    listings: dict[str, set[str]] = {}
    for key in keys:
        try:
            listings[key] = await source.list_space(key)
        except RemoteError as exc:
            report.failed.append((f"space:{key}", f"listing failed, space skipped: {exc}"))
    try:
        gone = await _gone_pages(index, source, listings, failed=set(keys) - set(listings))
    except RemoteError as exc:
        report.failed.append(("deletions", f"skipped: {exc}"))
        gone = []
    if gone:
        await index.delete_pages(gone)
        report.deleted = len(gone)

    for key in keys:
        if key not in listings:
            continue
        report.checkpoints[key] = await _sync_space(key, source=source, index=index, embedder=embedder,
                                                    sparse=sparse, store=store, options=options, full=full,
                                                    progress=progress, report=report)
    report.failed.extend(source.stats.failed)
    report.skipped_restricted = len(source.stats.skipped_restricted)
    report.api_calls = source.client.api_calls - calls0
    report.seconds = time.perf_counter() - t0
    return report


async def _sync_space(key: str, *, source: ConfluenceSource, index: Index, embedder: Embedder, sparse: SparseEncoder,
                      store: CheckpointStore, options: IngestOptions, full: bool, progress: bool,
                      report: SyncReport) -> str | None:
    """Ingest one space's pages changed since its checkpoint; returns the new checkpoint (what it may
    advance to: never past a page that failed in a way a retry can fix)."""
    old = await store.get_checkpoint(source.source_key, key)
    since = since_bound(old, source.overlap_s) if old and not full else None
    tracker = _Tracker()
    ing = await ingest_pages(tracker.wrap(source.iter_space(key, since=since)), index=index,
                             embedder=embedder, sparse=sparse, options=options, progress=progress)
    report.pages_seen += ing.pages_seen
    report.added += ing.added
    report.updated += ing.updated
    report.unchanged += ing.unchanged
    report.failed.extend(ing.failed)
    report.partial.extend(ing.partial)
    report.warnings.extend(ing.warnings)
    if tracker.fetch_error is not None:
        report.failed.append((f"space:{key}", f"stopped fetching: {tracker.fetch_error}"))
    blocking = {pid for pid, why in ing.failed if why.startswith(RETRYABLE_INGEST_PREFIXES)}
    new = tracker.checkpoint(blocking, old)
    if new and new != old:
        await store.set_checkpoint(source.source_key, key, new)
    return new


async def _gone_pages(
    index: Index, source: ConfluenceSource, listings: dict[str, set[str]], *, failed: set[str]
) -> list[str]:
    """Indexed pages of the synced spaces that are no longer in scope (deleted, archived, restricted...).

    Never touches pages of other spaces or other sources. With an index that can say which space each
    page is in (``page_spaces()``) this is free; otherwise the indexed ids missing from the listings are
    looked up in Confluence in batches (CQL ``id in (...)``): still visible in a synced space = out of
    scope, gone; visible elsewhere or in a space whose listing failed = kept; not visible any more =
    deleted. Non-numeric ids (other sources, e.g. a local export) are never Confluence pages: kept.
    """
    page_spaces: Any = getattr(index, "page_spaces", None)
    if page_spaces is not None:
        mapping: dict[str, str] = await page_spaces()
        return sorted(pid for pid, sp in mapping.items() if sp in listings and pid not in listings[sp])
    listed = set().union(*listings.values()) if listings else set()
    candidates = sorted(pid for pid in await index.page_hashes() if pid.isdigit() and pid not in listed)
    if not candidates:
        return []
    where = await source.locate(candidates)
    return [pid for pid in candidates if pid not in where or (where[pid] in listings and where[pid] not in failed)]
