"""Incremental Confluence -> index sync with deletions and per-space checkpoints.

Per space: (1) list the ids currently in scope (cheap, no bodies) and delete indexed pages of that
space that are gone, archived, restricted, out of scope or moved into a space that is not synced (the index
says where each page was indexed); (2) stream the pages modified since the checkpoint (minus the overlap,
see ``connectors.confluence.cql``), plus pages moved in from another synced space (fetched by id: a move
need not change ``lastmodified``), into ``pipeline.ingest.run``; (3) move the checkpoint to the newest
``lastmodified`` that is safely behind us.

"Safely behind us": pages arrive oldest edit first, so the checkpoint is the newest ``lastmodified``
of the pages before the first page that failed in a retryable way (an index write or embedding, or a results
page the API would not serve after retries). Pages after a failure are re-read next time, and
ingest's content hashes make that cheap. Content failures (an empty or unparsable page version) do
not hold the checkpoint back: only an edit can fix them, and an edit is seen by the next sync. When
offset paging proves unstable (the same page served twice because it was edited mid-sync, which
shifts offsets and may hide another page), the checkpoint is not advanced at all.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from connectors.confluence.access_sync import settle_access
from connectors.confluence.clock import site_zone
from connectors.confluence.cql import parse_utc, since_bound, to_utc_iso
from connectors.confluence.includes import load_includes, save_includes
from connectors.confluence.source import ConfluenceSource, SourceStats
from connectors.confluence.state import load_known, save_known
from pipeline.errors import ConfigError, RemoteError
from pipeline.ingest.report import IngestReport
from pipeline.ingest.run import VocabularyRun, ingest_pages
from pipeline.protocols import CheckpointStore, Embedder, Index, SparseEncoder, SyncStore
from pipeline.types import Page

if TYPE_CHECKING:
    from pipeline.ingest.options import IngestOptions

# Failures that another try may fix (a transient embedder or index): the checkpoint waits for them.
RETRYABLE_INGEST_PREFIXES = ("index write failed", "embedding failed")


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


@dataclass
class _Tracker:
    """Remembers what was handed to ingest, in order, and whether fetching stopped early."""

    seen: list[tuple[str, str | None]] = field(default_factory=list)
    extra: list[tuple[str, str | None]] = field(default_factory=list)  # read by id, outside the edit order
    fetch_error: RemoteError | None = None

    async def wrap(self, pages: AsyncIterator[Page], *, order: bool = True) -> AsyncIterator[Page]:
        """``pages``, remembered: in ``seen`` (they count for the checkpoint), or ``extra`` when not in edit
        ``order``."""
        into = self.seen if order else self.extra
        try:
            async for page in pages:
                into.append((page.id, page.updated))
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
    store: SyncStore,
    options: IngestOptions,
    full: bool = False,
    spaces: Sequence[str] | None = None,
    progress: bool = False,
    vocabulary: Path | None = None,
) -> SyncReport:
    """Sync ``spaces`` (default: the source's) into ``index``; ``full`` ignores checkpoints. ``vocabulary``:
    the keyword-expansion vocabulary to keep up to date; while it has no word counts yet, the run reads every
    page (as ``full``) so that the unchanged ones are counted too.

    Raises ``NotFoundError``/``AuthError``/``UnreachableError`` up front for a wrong space key, bad
    credentials or base URL; later per-page and per-space failures are reported, not raised.
    """
    t0 = time.perf_counter()
    calls0 = source.client.api_calls
    keys = tuple(dict.fromkeys(spaces or source.spaces))
    if not keys:
        raise ConfigError("no Confluence spaces to sync: set CONFLUENCE_SPACES")
    report = SyncReport()
    words = await VocabularyRun.start(vocabulary, sparse, None)  # loaded once, saved once, for every space
    full = full or (words is not None and words.bootstrap)
    try:
        await _sync_spaces(keys, source=source, index=index, embedder=embedder, sparse=sparse, store=store,
                           options=options, full=full, progress=progress, report=report, words=words)
    finally:
        if words is not None:
            await words.finish(embedder, report.warnings)
    report.api_calls = source.client.api_calls - calls0
    report.seconds = time.perf_counter() - t0
    return report


async def _sync_spaces(keys: Sequence[str], *, source: ConfluenceSource, index: Index, embedder: Embedder,
                       sparse: SparseEncoder, store: SyncStore, options: IngestOptions, full: bool,
                       progress: bool, report: SyncReport, words: VocabularyRun | None) -> None:
    """One sync cycle over ``keys`` after its set-up: listings, deletions and moves, then each space."""
    for key in keys:
        await _check_space(source, store, key, again=full)
    source.stats = SourceStats()  # counts are per run
    if source.macros is not None:
        source.macros.new_run()
    if source.permissions is not None:  # permissions are read afresh every cycle
        source.permissions.new_run()
        source.access = {}

    listings, pages_of = await _list_spaces(source, keys, report)
    zone = await _site_zone(source, store, listings, report) if not full else None
    gone, moved = gone_and_moved(await index.page_spaces(), listings)
    if gone:
        await index.delete_pages(gone)
        report.deleted = len(gone)

    known = {key: await load_known(store, source.source_key, key) for key in listings}
    for key in keys:
        if key not in listings:
            continue
        elsewhere = {
            pid: when for other, versions in known.items() if other != key for pid, when in versions.items()
        }
        report.checkpoints[key] = await _sync_space(
            key,
            source=source,
            index=index,
            embedder=embedder,
            sparse=sparse,
            store=store,
            options=options,
            full=full,
            progress=progress,
            report=report,
            moved=moved.get(key, []),
            zone=zone,
            containers=pages_of[key],
            elsewhere=elsewhere,
            versions=known[key],
            words=words,
        )
    report.permissions_changed = await settle_access(source, index, store, listings, gone, report.warnings)
    report.failed.extend(source.stats.failed)
    report.warnings.extend(source.stats.warnings)
    report.skipped_restricted = len(source.stats.skipped_restricted)
    report.unchanged += len(source.stats.known)


async def _list_spaces(source: ConfluenceSource, keys: Sequence[str],
                       report: SyncReport) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """Per space: every in-scope id (pages, and attachments and comments when synced), and the page ids alone
    (the containers of its attachments and comments). A space whose listing fails is reported and left out."""
    listings: dict[str, set[str]] = {}
    pages_of: dict[str, set[str]] = {}
    for key in keys:
        try:
            pages_of[key] = listings[key] = await source.list_space(key)
            if source.attachments:
                listings[key] = listings[key] | await source.list_attachments(key, containers=pages_of[key])
            if source.comments:
                listings[key] = listings[key] | await source.list_comments(key, containers=pages_of[key])
        except RemoteError as exc:
            report.failed.append((f"space:{key}", f"listing failed, space skipped: {exc}"))
    return listings, pages_of


async def _sync_space(
    key: str,
    *,
    source: ConfluenceSource,
    index: Index,
    embedder: Embedder,
    sparse: SparseEncoder,
    store: CheckpointStore,
    options: IngestOptions,
    full: bool,
    progress: bool,
    report: SyncReport,
    moved: Sequence[str] = (),
    zone: int | None = None,
    containers: set[str] | None = None,
    elsewhere: dict[str, str] | None = None,
    versions: dict[str, str],
    words: VocabularyRun | None = None,
) -> str | None:
    """Ingest one space's pages changed since its checkpoint, and the pages ``moved`` into it (fetched by id,
    outside the checkpoint's reckoning); ``versions``: the space's known versions, loaded by the caller.
    Returns the new checkpoint (never past a page that failed in a way a retry can fix)."""
    old = await store.get_checkpoint(source.source_key, key)
    since = since_bound(old, source.overlap_s, zone) if old and not full else None
    tracker = _Tracker()
    includes = await load_includes(store, source.source_key, key)
    listed = containers or set()
    known = {pid: when for pid, when in versions.items() if pid in listed}
    source.known = known if since else {}
    if source.macros is not None:
        source.macros.includes.clear()  # from here on: the pages of this space
    pages = _chain(tracker.wrap(source.iter_space(key, since=since)),
                   source.iter_ids(key, [m for m in moved if m.isdigit()]) if moved else None,
                   source.iter_attachments(key, containers=containers or set(), since=since)
                   if source.attachments else None,
                   source.iter_comments(key, containers=containers or set(), since=since)
                   if source.comments else None,
                   _moved_extras(source, key, containers or set(), moved, since),
                   _includers(source, key, tracker, includes, elsewhere or {}),
                   tracker.wrap(_unindexed(source, key, tracker, index, listed - set(known)), order=False)
                   if since else None)
    ing = await ingest_pages(pages, index=index, embedder=embedder, sparse=sparse, options=options,
                             progress=progress, vocabulary=words)
    _add_up(report, ing)
    if tracker.fetch_error is not None:
        report.failed.append((f"space:{key}", f"stopped fetching: {tracker.fetch_error}"))
    blocking = {pid for pid, why in ing.failed if why.startswith(RETRYABLE_INGEST_PREFIXES)}
    if source.macros is not None:
        await save_includes(store, source.source_key, key, includes, source.macros.includes)
    return await _settle(source, store, key, tracker, blocking, old, known, listed)


def _add_up(report: SyncReport, ing: IngestReport) -> None:
    report.pages_seen += ing.pages_seen
    report.added += ing.added
    report.updated += ing.updated
    report.unchanged += ing.unchanged
    report.failed.extend(ing.failed)
    report.partial.extend(ing.partial)
    report.warnings.extend(ing.warnings)


async def _settle(source: ConfluenceSource, store: CheckpointStore, key: str, tracker: _Tracker,
                  blocking: set[str], old: str | None, known: dict[str, str], listed: set[str]) -> str | None:
    """Advance the space's checkpoint (never past a page a retry can fix) and record the versions settled."""
    new = tracker.checkpoint(blocking, old)
    if new and new != old:
        await store.set_checkpoint(source.source_key, key, new)
    unsettled = blocking | {pid for pid, _ in source.stats.warnings}  # to be read again: not known
    await save_known(store, source.source_key, key, known,
                     [(pid, when) for pid, when in tracker.seen + tracker.extra + source.stats.unusable
                      if pid not in unsettled and pid in listed], new)
    return new


SPACE_CHECK_TTL_S = 6 * 3600


async def _check_space(source: ConfluenceSource, store: CheckpointStore, key: str, *, again: bool) -> None:
    """The space check (wrong key, credentials, base URL), at most every ``SPACE_CHECK_TTL_S`` per space: a
    passed check is kept in the checkpoint store row ``__space_ok__:<key>``; ``again`` (``--full``) checks
    anyway. Between checks, a space that disappears or becomes unreadable lists no pages, so its pages leave
    the index."""
    row = f"__space_ok__:{key}"
    kept = await store.get_checkpoint(source.source_key, row)
    now = datetime.now(UTC)
    if kept and not again:
        with contextlib.suppress(ValueError):
            if 0 <= (now - parse_utc(kept)).total_seconds() < SPACE_CHECK_TTL_S:
                return
    await source.check_space(key)
    await store.set_checkpoint(source.source_key, row, now.isoformat())


async def _site_zone(source: ConfluenceSource, store: CheckpointStore, listings: dict[str, set[str]],
                     report: SyncReport) -> int | None:
    """The zone the site reads CQL dates in (``connectors.confluence.clock``), from a space with pages; None
    (the wide overlap) when switched off or not measurable."""
    if not source.zone_probe:
        return None
    key = next((k for k, ids in listings.items() if ids), None)
    if key is None:
        return None
    try:
        report.cql_zone_min = await site_zone(source.client, store, source.source_key, source.scope_cql(key))
    except RemoteError as exc:
        report.warnings.append(("cql zone", f"not measured, using the wide overlap: {exc}"))
    return report.cql_zone_min


async def _moved_extras(source: ConfluenceSource, key: str, containers: set[str], moved: Sequence[str],
                        since: str | None) -> AsyncIterator[Page]:
    """Attachments and comments that moved into the space with their page (their time need not change), read
    again by id so they carry the new space and link. Pages moved are ``iter_ids``' work."""
    extras = set(moved)
    if since is None or not extras:
        return  # a full read of the space fetches them anyway
    if source.attachments and any(_is_attachment(m) for m in extras):
        async for page in source.iter_attachments(key, containers=containers, only=extras):
            yield page
    if source.comments:
        async for page in source.iter_comments(key, containers=containers, only=extras):
            yield page


async def _includers(source: ConfluenceSource, key: str, tracker: _Tracker,
                     includes: dict[str, dict[str, str]], elsewhere: dict[str, str]) -> AsyncIterator[Page]:
    """After the changed pages: the pages showing an older version of one of them, fetched again so the
    included text is current. Runs last, when ``tracker`` has seen every changed page. Included pages of other
    synced spaces count by the version those spaces indexed lately (``elsewhere``: their known versions as
    this run began), so their edits reach the includer at this space's next sync after theirs."""
    seen = {pid: updated or "" for pid, updated in tracker.seen}

    def changed(inc: str, when: str) -> bool:
        if inc in seen:
            return not when or seen[inc] != when
        return bool(when) and inc in elsewhere and elsewhere[inc] != when

    stale = sorted(pid for pid, shown in includes.items() if pid not in seen
                   and any(changed(inc, when) for inc, when in shown.items()))
    if stale:
        async for page in source.iter_ids(key, stale):
            yield page


async def _unindexed(source: ConfluenceSource, key: str, tracker: _Tracker, index: Index,
                     candidates: set[str]) -> AsyncIterator[Page]:
    """Last: the in-scope pages that are neither indexed nor were read this run nor were settled at their
    current version by an earlier one: pages whose read restriction was lifted, that gained an included label
    or came under the configured ancestor; none of that changes ``lastmodified``. Fetched by id."""
    seen = {pid for pid, _ in tracker.seen}
    indexed = await index.page_spaces()
    wanted = sorted(pid for pid in candidates - seen if pid not in indexed)
    if wanted:
        async for page in source.iter_ids(key, wanted):
            yield page


async def _chain(*parts: AsyncIterator[Page] | None) -> AsyncIterator[Page]:
    for part in parts:
        if part is not None:
            async for page in part:
                yield page


def _is_attachment(pid: str) -> bool:
    return pid.startswith("att") and pid[3:].isdigit()


def gone_and_moved(
    indexed: dict[str, str], listings: dict[str, set[str]]
) -> tuple[list[str], dict[str, list[str]]]:
    """From where each page is indexed (page id -> space) and this run's listings (space -> in-scope ids):

    - gone: pages indexed under a space listed in this run that no listing holds any more: deleted, archived,
      restricted, out of scope, or moved into a space that is not synced (or that the account cannot read);
    - moved: space -> pages it lists that are indexed under another space (moved between synced spaces).

    Pages indexed under a space not listed in this run (another ``--spaces`` selection, a listing that
    failed) are left alone, and so are non-numeric ids (other sources, e.g. a local export).
    """
    where = {pid: space for space, ids in listings.items() for pid in ids}
    gone = sorted(pid for pid, space in indexed.items()
                  if (pid.isdigit() or _is_attachment(pid)) and space in listings and pid not in where)
    moved: dict[str, list[str]] = {}
    for pid, space in where.items():
        if pid in indexed and indexed[pid] != space:
            moved.setdefault(space, []).append(pid)
    return gone, {space: sorted(ids) for space, ids in moved.items()}
