"""Incremental Confluence -> index sync with deletions and per-space checkpoints.

Per space: (1) when the listings are due (``connectors.confluence.schedule``), list the ids currently in
scope (cheap, no bodies) and delete indexed pages of that space that are gone, archived, restricted, out of
scope or moved into a space that is not synced (the index says where each page was indexed); (2) stream the
pages modified since the checkpoint (minus the overlap, see ``connectors.confluence.cql``), plus pages moved
in from another synced space (fetched by id: a move need not change ``lastmodified``), into
``pipeline.ingest.run``; (3) move the checkpoint to the newest ``lastmodified`` that is safely behind us.

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
from collections import ChainMap
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from connectors.confluence.access_sync import settle_access
from connectors.confluence.cql import since_bound
from connectors.confluence.includes import known_elsewhere, load_includes, save_includes, stale_includers
from connectors.confluence.listing import gone_and_moved, rejected_credentials
from connectors.confluence.schedule import (
    check_space,
    cycle_zone,
    due_listings,
    forget_listing,
    remember_listing,
    unchanged,
)
from connectors.confluence.source import ConfluenceSource, SourceStats
from connectors.confluence.space_reads import (
    Held,
    IndexedPages,
    chain,
    includers,
    noting,
    settle_held,
    still_indexed,
    unindexed,
)
from connectors.confluence.state import load_checkpoint, load_known, save_known
from connectors.confluence.sync_extras import (
    extra_items,
    extras_since,
    list_extras,
    load_pending,
    returning,
    returning_items,
    settle_pending,
)
from connectors.confluence.tracker import Tracker, retryable, stopped
from pipeline.errors import ConfigError, RemoteError
from pipeline.ingest.page_work import PageWork
from pipeline.ingest.report import IngestReport
from pipeline.ingest.run import ingest_pages
from pipeline.ingest.vocabulary_run import KeptCounts, VocabularyRun
from pipeline.protocols import CheckpointStore, Embedder, Index, SparseEncoder, SyncStore
from pipeline.runtime.foreground import StepAside
from pipeline.types import Page

if TYPE_CHECKING:
    from pipeline.ingest.options import IngestOptions

@dataclass
class SyncReport:
    added: int = 0
    updated: int = 0
    deleted: int = 0
    unchanged: int = 0
    skipped_restricted: int = 0
    permissions_changed: int = 0  # per-user access: pages whose permissions were written (no re-embedding)
    failed: list[tuple[str, str]] = field(default_factory=list)  # (page id or "space:KEY", reason)
    partial: list[tuple[str, str]] = field(default_factory=list)  # indexed without all of their text
    warnings: list[tuple[str, str]] = field(default_factory=list)  # indexed in full after a recovery
    api_calls: int = 0
    seconds: float = 0.0
    pages_seen: int = 0
    checkpoints: dict[str, str | None] = field(default_factory=dict)  # space -> checkpoint after the run
    cql_zone_min: int | None = None  # the zone the site reads CQL dates in (minutes east of UTC), if measured
    listed: int = 0  # spaces listed this cycle (``connectors.confluence.schedule``)

    def add(self, ing: IngestReport) -> None:
        """Count one ingest run of the cycle in."""
        self.pages_seen += ing.pages_seen
        self.added += ing.added
        self.updated += ing.updated
        self.unchanged += ing.unchanged
        self.failed.extend(ing.failed)
        self.partial.extend(ing.partial)
        self.warnings.extend(ing.warnings)


async def sync_confluence(
    *,
    source: ConfluenceSource,
    index: Index,
    embedder: Embedder,
    sparse: SparseEncoder,
    store: SyncStore,
    options: IngestOptions,
    full: bool = False,
    spaces: Sequence[str] | None = None,
    progress: bool = False,
    vocabulary: Path | None = None,
    step_aside: StepAside | None = None,
    work: PageWork | None = None,
    kept: KeptCounts | None = None,
) -> SyncReport:
    """Sync ``spaces`` (default: the source's) into ``index``; ``full`` ignores checkpoints. ``vocabulary``:
    the keyword-expansion vocabulary to keep up to date; while it has no word counts yet, the run reads every
    page (as ``full``) so that the unchanged ones are counted too. ``step_aside``: awaited between ingest
    steps (``evident serve``: questions first). ``work``: where pages are parsed and encoded (``page_work``;
    default: a thread); the caller closes it. ``kept``: a sync loop's vocabulary counts, kept between cycles.

    Raises ``NotFoundError``/``AuthError``/``UnreachableError`` up front for a wrong space key, bad
    credentials or base URL; later per-page and per-space failures are reported, not raised.
    """
    t0 = time.perf_counter()
    calls0 = source.client.api_calls
    keys = tuple(dict.fromkeys(spaces or source.spaces))
    if not keys:
        raise ConfigError("no Confluence spaces to sync: set CONFLUENCE_SPACES")
    report = SyncReport()
    # loaded once, saved once, for every space
    async with VocabularyRun.held(vocabulary, sparse, None, embedder, report.warnings, kept) as words:
        full = full or (words is not None and words.bootstrap)
        await _sync_spaces(
            keys, _Cycle(source, index, embedder, sparse, store, options, full, progress, report, words,
                         step_aside, work)
        )
    report.api_calls = source.client.api_calls - calls0
    report.seconds = time.perf_counter() - t0
    return report


@dataclass
class _Cycle:
    """What every step of one sync cycle works with."""

    source: ConfluenceSource
    index: Index
    embedder: Embedder
    sparse: SparseEncoder
    store: SyncStore
    options: IngestOptions
    full: bool
    progress: bool
    report: SyncReport
    words: VocabularyRun | None
    step_aside: StepAside | None = None
    work: PageWork | None = None
    indexed: IndexedPages = field(init=False)  # the index's pages before this cycle wrote any
    live: dict[str, str] | None = field(init=False, default=None)  # page hashes: read once, kept current

    def __post_init__(self) -> None:
        self.indexed = IndexedPages(self.index)

    async def ingest(self, pages: AsyncIterator[Page]) -> IngestReport:
        if self.live is None:  # after this cycle's deletions, before its first write
            self.live = await self.index.page_hashes()
        ing = await ingest_pages(pages, index=self.index, embedder=self.embedder, sparse=self.sparse,
                                 options=self.options, progress=self.progress, vocabulary=self.words,
                                 step_aside=self.step_aside, live=self.live, work=self.work)
        self.report.add(ing)
        return ing

    async def delete(self, page_ids: Sequence[str]) -> None:
        """Take pages out of the index, the page hashes held and the vocabulary's counts."""
        await self.index.delete_pages(page_ids)
        self.report.deleted += len(page_ids)
        if self.live is not None:
            for pid in page_ids:
                self.live.pop(pid, None)
        if self.words is not None:
            await self.words.forget(page_ids)


async def _sync_spaces(keys: Sequence[str], cycle: _Cycle) -> None:
    """One sync cycle over ``keys`` after its set-up: the listings that are due (``schedule``), deletions and
    moves, then each space, then the includers an edit in a later space made stale."""
    source, store, report = cycle.source, cycle.store, cycle.report
    await _start(cycle, keys)
    listed_at = datetime.now(UTC)
    due = await due_listings(source, store, keys, full=cycle.full)
    listings, pages_of, incomplete = await _list_spaces(source, [k for k in keys if k in due], report)
    report.listed = len(listings)
    zone = await cycle_zone(source, store, keys, listings, report.warnings) if not cycle.full else None
    report.cql_zone_min = zone
    gone, moved, unlisted = await _deletions(cycle, listings, incomplete)
    synced = [k for k in keys if k in listings or k not in due]
    known = {key: await load_known(store, source.source_key, key) for key in synced}
    for key in synced:
        report.checkpoints[key] = await _sync_space(
            key, cycle, moved=moved.get(key, []), zone=zone, containers=pages_of.get(key),
            listing=listings.get(key), elsewhere=known_elsewhere(known, key), versions=known[key])
        known[key] = await load_known(store, source.source_key, key)  # later spaces see what this one read
        if key in listings and key not in incomplete:
            await remember_listing(source, store, key, listed_at)
    if source.macros is not None:
        for key in synced:
            await _refresh_includers(cycle, key, known_elsewhere(known, key))
    report.permissions_changed = await settle_access(source, cycle.index, store, listings, gone,
                                                     report.warnings, unlisted=unlisted)
    report.failed.extend(source.stats.failed)
    report.warnings.extend(source.stats.warnings)
    report.skipped_restricted = len(source.stats.skipped_restricted)
    report.unchanged += len(source.stats.known)


async def _start(cycle: _Cycle, keys: Sequence[str]) -> None:
    source = cycle.source
    for key in keys:
        await check_space(source, cycle.store, key, again=cycle.full)
    source.stats = SourceStats()  # counts are per run
    source.new_cycle()
    if source.macros is not None:
        source.macros.new_run()
    if source.permissions is not None:  # permissions are read afresh every cycle
        source.permissions.new_run()
        source.access = {}


async def _deletions(cycle: _Cycle, listings: dict[str, set[str]],
                     incomplete: set[str]) -> tuple[list[str], dict[str, list[str]], set[str]]:
    """Delete what left the synced spaces; the pages moved between them, by space; and what is kept unlisted:
    a space whose attachment or comment listing failed keeps everything indexed under it this cycle."""
    if not listings:  # no space listed this cycle: nothing can be told gone or moved
        return [], {}, set()
    indexed = await cycle.indexed.all()
    kept = {k: ids | {pid for pid, sp in indexed.items() if sp == k} if k in incomplete else ids
            for k, ids in listings.items()}
    gone, moved = gone_and_moved(indexed, kept)
    if gone:
        await cycle.delete(gone)
    return gone, moved, {pid for k in incomplete for pid in kept[k] - listings[k]}


async def _refresh_includers(cycle: _Cycle, key: str, elsewhere: Mapping[str, str]) -> None:
    """Pages of ``key`` that include a page of another space that changed after ``key`` was synced this cycle:
    read again now, so the included text is current in the same cycle."""
    source, store = cycle.source, cycle.store
    includes = await load_includes(store, source.source_key, key)
    stale = await still_indexed(cycle.indexed, key, stale_includers({}, includes, elsewhere))
    if not stale:  # the usual case: no request, no ingest run
        return
    assert source.macros is not None
    source.macros.includes.clear()
    ing = await cycle.ingest(source.iter_ids(key, stale))
    await save_includes(store, source.source_key, key, includes, source.macros,
                        unsettled=_unsettled(source, retryable(ing)))


async def _list_spaces(source: ConfluenceSource, keys: Sequence[str],
                       report: SyncReport) -> tuple[dict[str, set[str]], dict[str, set[str]], set[str]]:
    """Per space: every in-scope id (pages, and attachments and comments when synced), the page ids alone (the
    containers of its attachments and comments), and the spaces whose attachment or comment listing failed
    (what is indexed from those is kept). A space whose page listing fails is reported and left out."""
    listings: dict[str, set[str]] = {}
    pages_of: dict[str, set[str]] = {}
    incomplete: set[str] = set()
    for key in keys:
        try:
            pages_of[key] = await source.list_space(key)
        except RemoteError as exc:
            if rejected_credentials(exc):
                raise  # not this space's problem: every space would fail alike (one error, exit 2)
            report.failed.append((f"space:{key}", f"listing failed, space skipped: {exc}"))
            continue
        extras, complete = await list_extras(source, key, pages_of[key], report.failed)
        listings[key] = pages_of[key] | extras
        if not complete:
            incomplete.add(key)
    return listings, pages_of, incomplete


async def _sync_space(
    key: str,
    cycle: _Cycle,
    *,
    moved: Sequence[str],
    zone: int | None,
    containers: set[str] | None,
    listing: set[str] | None,
    elsewhere: ChainMap[str, str],
    versions: dict[str, str],
) -> str | None:
    """Ingest one space's pages changed since its checkpoint, the pages ``moved`` into it (fetched by id,
    outside the checkpoint's reckoning), and its attachments and comments; ``versions``: the space's known
    versions; ``listing``/``containers``: every in-scope id and page id, or None when the space was not listed
    this cycle (then only what changed is asked, ``schedule.unchanged`` first). Returns the new checkpoint
    (never past a page that failed in a way a retry can fix)."""
    source, store, report = cycle.source, cycle.store, cycle.report
    old = await load_checkpoint(store, source.source_key, key, report.warnings)
    since = since_bound(old, source.overlap_s, zone) if old and not cycle.full else None
    pending = await load_pending(store, source.source_key, key)
    if listing is None and since is not None and pending is None and await _same(cycle, key, since, versions,
                                                                                  elsewhere):
        return old
    # not listed: the space's indexed pages (and those read below) are the containers
    containers = await cycle.indexed.pages(key) if containers is None else containers
    held = await Held.load(source, store, key, containers)
    tracker, extras = Tracker(), Tracker()
    includes = await load_includes(store, source.source_key, key)
    known = versions if listing is None else {pid: w for pid, w in versions.items() if pid in listing}
    source.known = known if since else {}
    if source.macros is not None:
        source.macros.includes.clear()  # from here on: the pages of this space
    listed_now = since is not None and listing is not None
    pages = chain(noting(tracker.wrap(source.iter_space(key, since=since)), containers, source),
                  source.iter_ids(key, [m for m in moved if m.isdigit()]) if moved else None,
                  extras.wrap(extra_items(source, key, containers, moved, extras_since(
                      since, old, pending, source.overlap_s, zone)), order=False),
                  extras.wrap(returning_items(source, key, containers, returning(
                      source, await cycle.indexed.all(), held, known, extras.extra, moved)),
                      order=False) if listed_now else None,
                  includers(source, key, tracker, cycle.indexed, includes, elsewhere.new_child(versions)),
                  tracker.wrap(unindexed(source, key, tracker, cycle.indexed,
                                         containers - set(known) - set(held.unusable)),
                               order=False) if listed_now else None)
    ing = await cycle.ingest(pages)
    stopped(key, tracker, extras, report.failed)
    tracker.extra.extend(extras.extra)  # attachments and comments: known versions, not the checkpoint
    await save_includes(store, source.source_key, key, includes, source.macros,
                        unsettled=_unsettled(source, retryable(ing)))
    return await _close(cycle, key, tracker, ing, held, old, versions, listing)


async def _same(cycle: _Cycle, key: str, since: str, versions: dict[str, str],
                elsewhere: ChainMap[str, str]) -> bool:
    """Between listings: no includer of the space shows an older version of a page than is indexed, and the
    space's probe found nothing to read (``schedule.unchanged``; counted)."""
    source = cycle.source
    includes = await load_includes(cycle.store, source.source_key, key) if source.macros is not None else {}
    if await still_indexed(cycle.indexed, key, stale_includers({}, includes, elsewhere.new_child(versions))):
        return False
    same = await unchanged(source, key, since, versions, lambda: cycle.indexed.pages(key))
    if same is not None:
        cycle.report.unchanged += same
    return same is not None


async def _close(cycle: _Cycle, key: str, tracker: Tracker, ing: IngestReport, held: Held, old: str | None,
                 versions: dict[str, str], listing: set[str] | None) -> str | None:
    """What a space's read settles: its versions, what failed for its content, the pages back, the
    checkpoint (returned)."""
    blocking = retryable(ing)
    await settle_pending(cycle.source, cycle.store, key, old, tracker.extra, blocking)
    # settled no more: dropped now, or not listed any more (a later listing that lists them again reads them)
    dropped = set(versions) - listing if listing is not None else await _drop_restricted(cycle, key)
    await settle_held(cycle.source, cycle.store, key, held, tracker.seen, tracker.seen + tracker.extra,
                      [f for f in ing.failed if f[0] not in blocking], retry=bool(blocking),
                      indexed=await cycle.indexed.all(), listing=listing)
    unusable = cycle.source.stats.unusable[held.unusable_from:]  # this space's, not the cycle's
    return await _settle(cycle.source, cycle.store, key, tracker, blocking, old, versions, listing, dropped,
                         unusable)


def _unsettled(source: ConfluenceSource, blocking: set[str]) -> set[str]:
    """What is to be read again: the retryable failures (``blocking``) and pages read with a warning."""
    return blocking | {pid for pid, _ in source.stats.warnings}


async def _drop_restricted(cycle: _Cycle, key: str) -> set[str]:
    """Between listings: the pages of ``key`` read with read restrictions now (an edit that restricted them)
    leave the index in this cycle, and the space is listed in the next one (their comments, attachments and
    descendants). Returns the pages removed."""
    gone = sorted(cycle.source.stats.skipped_restricted & await cycle.indexed.pages(key))
    if gone:
        await cycle.delete(gone)
        await forget_listing(cycle.source, cycle.store, key)
    return set(gone)


async def _settle(source: ConfluenceSource, store: CheckpointStore, key: str, tracker: Tracker,
                  blocking: set[str], old: str | None, known: dict[str, str],
                  listed: set[str] | None, dropped: set[str],
                  unusable: Sequence[tuple[str, str | None]]) -> str | None:
    """Advance the space's checkpoint (never past a page a retry can fix) and record the versions settled
    (of those ``listed``, when the space was listed this cycle; and the space's ``unusable`` items), ``known``
    less ``dropped``."""
    new = old if key in source.stats.unstable else tracker.checkpoint(blocking, old)
    if new and new != old:
        await store.set_checkpoint(source.source_key, key, new)
    unsettled = _unsettled(source, blocking)  # to be read again: not known
    await save_known(store, source.source_key, key, known,
                     [(pid, when) for pid, when in [*tracker.seen, *tracker.extra, *unusable]
                      if pid not in unsettled and (listed is None or pid in listed)], new, drop=dropped)
    return new
