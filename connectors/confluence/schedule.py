"""What a sync cycle asks Confluence only now and then: the space check, and the listing of every page.

Listing a space (every in-scope id with its read restrictions, then its attachments and comments) is how a
sync sees what no edit time shows: pages deleted, archived or moved, read restrictions added or lifted, a
label gained, a page that came under the configured ancestor. It costs about one request per 200 pages and
kind, and Confluence has no feed of those changes, so a space is listed when its last listing is older than
``EVIDENT_SYNC_LISTING_INTERVAL_S`` (and always with ``--full``, with per-user access, whose permissions are
read afresh every cycle, or when no listing of it is kept). Between listings a cycle asks one question per
space, what in it (pages, blog posts, attachments, comments) was modified since the checkpoint
(``unchanged``); when every answer is a version already indexed, nothing else is asked, so a cycle with no
change costs one request a space.

What a listing learns that later cycles need is kept in the checkpoint store: when it ran and, in space mode,
which pages carry their own read restrictions (their descendants are left out between listings too). A page
edited between listings is read with its restrictions, so an edit that also restricted it removes it in that
cycle; a restriction added without an edit waits for the next listing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from connectors.confluence.clock import site_zone
from connectors.confluence.cql import EXPAND_RESTRICTIONS, parse_utc, quote, version_time
from connectors.confluence.listing import rejected_credentials
from connectors.confluence.state import load_row, save_row
from pipeline.errors import InputError, RemoteError
from pipeline.protocols import CheckpointStore

if TYPE_CHECKING:
    from connectors.confluence.source import ConfluenceSource

SPACE_CHECK_TTL_S = 6 * 3600


async def check_space(source: ConfluenceSource, store: CheckpointStore, key: str, *, again: bool) -> None:
    """The space check (wrong key, credentials, base URL), at most every ``SPACE_CHECK_TTL_S`` per space: a
    passed check is kept in the checkpoint store row ``__space_ok__:<key>``; ``again`` (``--full``) checks
    anyway. Between checks, a space that disappears or becomes unreadable lists no pages at its next listing,
    so its pages leave the index then."""
    row = f"__space_ok__:{key}"
    kept = await store.get_checkpoint(source.source_key, row)
    now = datetime.now(UTC)
    if kept and not again:
        with contextlib.suppress(InputError):  # a damaged row: checked again
            if 0 <= (now - parse_utc(kept)).total_seconds() < SPACE_CHECK_TTL_S:
                return
    await source.check_space(key)
    await store.set_checkpoint(source.source_key, row, now.isoformat())


async def due_listings(source: ConfluenceSource, store: CheckpointStore, keys: Sequence[str], *,
                       full: bool) -> set[str]:
    """The spaces of ``keys`` this cycle lists: all of them when any is due (so that a page moved between two
    synced spaces is seen leaving one and arriving in the other in the same cycle), else none; when none,
    what their last listings learnt is restored into ``source`` (the pages with own read restrictions). A
    listing made with another scope (``_scope``: mode, labels, ancestor, kinds) is due at once."""
    interval = source.listing_interval_s
    if full or interval <= 0 or source.permissions is not None:
        return set(keys)
    now, scope = datetime.now(UTC), _scope(source)
    restricted: dict[str, set[str]] = {}
    for key in keys:
        kept = await load_row(store, source.source_key, "listed", key)
        ids = kept.get("restricted")
        try:
            age = (now - parse_utc(str(kept.get("at", "")))).total_seconds()
        except InputError:  # never listed, or a damaged row: listed now
            return set(keys)
        if not 0 <= age < interval or not isinstance(ids, list) or kept.get("scope") != scope:
            return set(keys)
        restricted[key] = {str(pid) for pid in ids}
    for key, ids in restricted.items():
        source.assume_restricted(key, ids)
    return set()


def _scope(source: ConfluenceSource) -> str:
    """What a listing's ids depend on besides the site: a listing made under other settings is out of date."""
    return repr((source.permissions is not None, source.include_restricted, source.labels_include,
                 source.labels_exclude, source.ancestor, source.blog_posts, source.attachments,
                 source.comments))


async def remember_listing(source: ConfluenceSource, store: CheckpointStore, key: str, at: datetime) -> None:
    """Keep when ``key`` was listed (``at``: when its listing began) and its pages with own read
    restrictions."""
    row = {"at": at.isoformat(), "restricted": sorted(source.restricted_ids(key)), "scope": _scope(source)}
    await save_row(store, source.source_key, "listed", key, row)


async def forget_listing(source: ConfluenceSource, store: CheckpointStore, key: str) -> None:
    """Make ``key``'s listing due at the next cycle."""
    await save_row(store, source.source_key, "listed", key, {})


async def unchanged(source: ConfluenceSource, key: str, since: str, known: dict[str, str],
                    pages: Callable[[], Awaitable[set[str]]]) -> int | None:
    """When nothing in space ``key`` was modified since the CQL bound ``since`` but versions ``known`` to be
    indexed, or items the sync would pass over (``ConfluenceSource.passes_over``, given the space's indexed
    ``pages``), how many such were; None on a change. One request, no bodies; a second results page counts as
    a change."""
    kinds = ["page"] + (["blogpost"] if source.blog_posts else []) + (
        ["attachment"] if source.attachments else []) + (["comment"] if source.comments else [])
    cql = (f"space = {quote(key)} and type in ({', '.join(kinds)}) and lastmodified >= {quote(since)} "
           "order by lastmodified asc")
    limit = source.id_limit
    found: list[dict[str, Any]] = []
    labels = ",metadata.labels" if source.labels_include or source.labels_exclude else ""
    rows = source.client.search(cql, expand=f"version,container,ancestors{labels},{EXPAND_RESTRICTIONS}",
                                limit=limit)
    try:
        async for r in rows:
            found.append(r)
            if len(found) >= limit:  # more may follow: not worth a second request to tell
                return None
    except RemoteError as exc:
        if rejected_credentials(exc):
            raise
        return None  # not told: the space's own queries ask (and report what fails)
    finally:
        await rows.aclose()  # type: ignore[attr-defined]
    new = [r for r in found if (when := version_time(r)) is None or known.get(str(r.get("id", ""))) != when]
    if new:
        indexed = await pages()
        if not all(source.passes_over(r, key, indexed) for r in new):
            return None
    return len(found)


async def cycle_zone(source: ConfluenceSource, store: CheckpointStore, keys: Sequence[str],
                     listings: dict[str, set[str]], warnings: list[tuple[str, str]]) -> int | None:
    """The zone the site reads CQL dates in (``connectors.confluence.clock``, measured every 6 h), from a
    space with pages (the first space not listed this cycle when none listed has any); None (the wide
    overlap) when switched off or not measurable (a warning)."""
    if not source.zone_probe:
        return None
    key = next((k for k, ids in listings.items() if ids), next((k for k in keys if k not in listings), None))
    if key is None:
        return None
    try:
        return await site_zone(source.client, store, source.source_key, source.scope_cql(key))
    except RemoteError as exc:
        warnings.append(("cql zone", f"not measured, using the wide overlap: {exc}"))
        return None
