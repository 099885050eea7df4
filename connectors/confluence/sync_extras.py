"""Attachments and comments in a sync cycle: listed and fetched so that one refused or failing request costs
those items, never the space's pages nor the run; items indexed at their current version are skipped (their
own known versions), so a no-change cycle downloads and reads nothing."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence

from connectors.confluence.listing import is_attachment, rejected_credentials
from connectors.confluence.source import ConfluenceSource
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
