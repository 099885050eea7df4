"""Attachments and comments in a sync cycle: listed and fetched so that one refused or failing request costs
those items, never the space's pages nor the run; items indexed at their current version are skipped (their
own known versions), so a no-change cycle downloads and reads nothing."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence

from connectors.confluence.listing import is_attachment, rejected_credentials
from connectors.confluence.source import ConfluenceSource
from connectors.confluence.space_reads import Held
from pipeline.errors import RemoteError
from pipeline.types import Page


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
              read: list[tuple[str, str | None]]) -> Callable[[], set[str]]:
    """What ``returning_items`` reads in a listing cycle: the listed attachments and comments of the pages
    that are back (``Held.back_pages``: not indexed before the cycle, ``indexed`` being every id indexed
    then), unless indexed, settled (``known``), failed for their content (``held.unusable``, this cycle's
    failures) or ``read`` this cycle already (id, version)."""
    def wanted() -> set[str]:
        back = held.back_pages(indexed)
        if not back:
            return set()
        unusable = {pid for pid, _ in source.stats.unusable} | {pid for pid, _ in source.stats.failed}
        done = {pid for pid, _ in read}
        return {item for item, page in source.container_of.items() if page in back and item not in indexed
                and item not in known and item not in held.unusable and item not in unusable
                and item not in done}
    return wanted
