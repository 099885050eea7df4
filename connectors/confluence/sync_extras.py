"""Attachments and comments in a sync cycle: listed and fetched so that one refused or failing request costs
those items, never the space's pages nor the run; items indexed at their current version are skipped (their
own known versions), so a no-change cycle downloads and reads nothing.

Attachments and comments are asked for since the space's checkpoint, which only page edits move. So that a
refused or failing request, or an item whose embedding or index write failed, is not passed by the next
page edit, the checkpoint such a cycle started from is kept (``pending``, the row ``__extras_from__:<space>``)
and later cycles ask for attachments and comments since it (and do not skip the space on its probe) until one
reads them all."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from datetime import UTC, datetime

from connectors.confluence.cql import parse_utc, since_bound
from connectors.confluence.listing import is_attachment, rejected_credentials
from connectors.confluence.source import ConfluenceSource
from connectors.confluence.space_reads import Held
from connectors.confluence.state import load_row, save_row
from pipeline.errors import InputError, RemoteError
from pipeline.protocols import CheckpointStore
from pipeline.types import Page

_PENDING = "extras_from"
GIVE_UP_S = 24 * 3600  # how long attachments and comments that keep failing are asked for again


async def load_pending(store: CheckpointStore, source_key: str, key: str) -> str | None:
    """Where the space's attachments and comments must be asked from (a checkpoint, or "" for all of them);
    None when the last cycle read them all."""
    at = (await load_row(store, source_key, _PENDING, key)).get("at")
    return at if isinstance(at, str) else None


def extras_since(since: str | None, old: str | None, pending: str | None, overlap_s: int,
                 zone: int | None) -> str | None:
    """The CQL bound of this cycle's attachment and comment queries: the pages' ``since``, or earlier where
    an item is ``pending`` from a checkpoint before ``old`` (None: all of them)."""
    if pending is None or since is None:
        return since
    return since_bound(min(pending, old), overlap_s, zone) if pending and old else None


async def settle_pending(source: ConfluenceSource, store: CheckpointStore, key: str, old: str | None,
                         extras: Sequence[tuple[str, str | None]], blocking: set[str]) -> None:
    """After the space's read: keep the earliest checkpoint from which an attachment or comment is still to
    be read (a listing or query of them failed, one of them failed to download with a server error, or one
    of ``extras`` failed in a way a retry can fix), or clear it. After ``GIVE_UP_S`` of failing it is
    cleared with a warning: what still fails waits for an edit (or ``--full``), not every cycle."""
    kept = await load_row(store, source.source_key, _PENDING, key)
    pending = kept.get("at") if isinstance(kept.get("at"), str) else None
    kinds = {f"attachments:{key}", f"comments:{key}"}
    unread = [(pid, when) for space, pid, when in source.stats.unread if space == key]
    failed = (any(k in kinds for k, _ in source.stats.failed) or bool(source.stats.unlisted & kinds)
              or bool(unread) or any(pid in blocking for pid, _ in extras))
    now = datetime.now(UTC)
    first = str(kept.get("first") or now.isoformat())
    try:
        expired = (now - parse_utc(first)).total_seconds() > GIVE_UP_S
    except InputError:  # a damaged row: starts again from now
        first, expired = now.isoformat(), False
    if failed and expired:
        source.stats.warnings.append((f"space:{key}", "attachments or comments failing for 24 h are left "
                                                       "until edited (evident sync --full reads them)"))
        source.stats.unusable.extend(unread)  # settled at their versions: not asked for every cycle
        failed = False
    if not failed:
        row: dict[str, str] = {}
    else:
        at = "" if old is None or pending == "" else min(pending, old) if pending else old
        row = {"at": at, "first": first}
    await save_row(store, source.source_key, _PENDING, key, row, before=kept)


async def list_extras(source: ConfluenceSource, key: str, containers: set[str],
                      failed: list[tuple[str, str]]) -> tuple[set[str], bool]:
    """The ids of the space's attachments and comments, and whether every listing answered (a refused one is
    reported in ``failed``; the caller keeps what is indexed from it)."""
    ids: set[str] = set()
    complete = True
    listers: list[tuple[str, Callable[..., object]]] = []
    if source.attachments:
        listers.append(("attachments", source.list_attachments))
    if source.comments:
        listers.append(("comments", source.list_comments))
    for what, lister in listers:
        try:
            ids |= await lister(key, containers=containers)  # type: ignore[misc]
        except RemoteError as exc:
            if rejected_credentials(exc):
                raise
            failed.append((f"{what}:{key}", f"listing failed, the indexed ones are kept: {exc}"))
            source.stats.unlisted.add(f"{what}:{key}")
            complete = False
    return ids, complete


async def extra_items(source: ConfluenceSource, key: str, containers: set[str], moved: Sequence[str],
                      since: str | None) -> AsyncIterator[Page]:
    """The space's attachments and comments changed since ``since`` (known versions skipped), then those that
    moved into it with their page. A kind whose requests fail stops there, reported; the others go on."""
    moved_in = set(moved) if since is not None else set()
    kinds: list[tuple[str, AsyncIterator[Page] | None]] = [
        ("attachments", source.iter_attachments(key, containers=containers, since=since)
         if source.attachments else None),
        ("comments", source.iter_comments(key, containers=containers, since=since)
         if source.comments else None),
        # moved with their page (their time need not change): read again by id for the new space and link
        ("attachments", source.iter_attachments(key, containers=containers, only=moved_in)
         if source.attachments and any(is_attachment(m) for m in moved_in) else None),
        ("comments", source.iter_comments(key, containers=containers, only=moved_in)
         if source.comments and moved_in else None),
    ]
    async for page in _each(source, key, kinds):
        yield page


async def returning_items(source: ConfluenceSource, key: str, containers: set[str],
                          wanted: Callable[[], set[str]]) -> AsyncIterator[Page]:
    """The attachments and comments ``wanted()`` names (asked when their turn comes), read by id whatever
    their time: those of pages that came into scope without an edit (a read restriction lifted, a label
    gained), older than any incremental query reaches."""
    ids = wanted()
    kinds: list[tuple[str, AsyncIterator[Page] | None]] = [
        ("attachments", source.iter_attachments(key, containers=containers, only=ids)
         if source.attachments and any(is_attachment(i) for i in ids) else None),
        ("comments", source.iter_comments(key, containers=containers, only=ids)
         if source.comments and any(i.isdigit() for i in ids) else None),
    ]
    async for page in _each(source, key, kinds):
        yield page


async def _each(source: ConfluenceSource, key: str,
                kinds: list[tuple[str, AsyncIterator[Page] | None]]) -> AsyncIterator[Page]:
    for what, items in kinds:
        if items is None or f"{what}:{key}" in source.stats.unlisted:
            continue
        try:
            async for page in items:
                yield page
        except RemoteError as exc:
            if rejected_credentials(exc):
                raise
            source.stats.failed.append((f"{what}:{key}", f"not fetched this cycle: {exc}"))


def returning(source: ConfluenceSource, indexed: dict[str, str], held: Held, known: dict[str, str],
              read: list[tuple[str, str | None]], moved: Sequence[str] = ()) -> Callable[[], set[str]]:
    """What ``returning_items`` reads in a listing cycle: the listed attachments and comments of the pages
    that are back (``Held.back_pages``: not indexed before the cycle, ``indexed`` being every id indexed
    then) or ``moved`` into the space (items added after a move no edit showed), unless indexed, settled
    (``known``), failed for their content (``held.unusable``, this cycle's failures) or ``read`` this cycle
    already (id, version)."""
    def wanted() -> set[str]:
        back = held.back_pages(indexed) | set(moved)
        if not back:
            return set()
        unusable = {pid for pid, _ in source.stats.unusable} | {pid for pid, _ in source.stats.failed}
        done = {pid for pid, _ in read}
        return {item for item, page in source.container_of.items() if page in back and item not in indexed
                and item not in known and item not in held.unusable and item not in unusable
                and item not in done}
    return wanted
