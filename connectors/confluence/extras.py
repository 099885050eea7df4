"""Attachments and comments of in-scope pages, each indexed as a page of its own (``CONFLUENCE_ATTACHMENTS``,
``CONFLUENCE_COMMENTS``), with their page's permissions: a mixin of ``ConfluenceSource``."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from connectors.confluence.client import ConfluenceClient
from connectors.confluence.cql import quote, to_utc_iso, version_time
from connectors.confluence.listing import rejected_credentials
from connectors.local_formats import DOCUMENT_SUFFIXES, document_body
from pipeline.access.scope import PageAccess
from pipeline.errors import InputError, NotFoundError, RateLimitedError, RemoteError, TransientError
from pipeline.types import Page


class PageExtras:
    """What ``ConfluenceSource`` sets up; the methods below read attachments and comments through it."""

    client: ConfluenceClient
    id_limit: int
    page_limit: int
    max_attachment_bytes: int
    stats: Any  # SourceStats: failures are reported there

    access: dict[str, PageAccess]
    known: dict[str, str]  # id -> version time indexed lately (the sync sets it per space)
    container_of: dict[str, str]  # attachment or comment id -> its page, as this cycle's listings found them

    def access_of(self, page_id: str) -> PageAccess | None:
        raise NotImplementedError

    def _attachments_cql(self, space: str, since: str | None = None) -> str:
        cql = f"space = {quote(space)} and type = attachment"
        return cql + (f" and lastmodified >= {quote(since)}" if since else "") + " order by lastmodified asc"

    async def list_attachments(self, space: str, *, containers: set[str]) -> set[str]:
        """Ids of the readable attachments (Markdown, text, PDF) of ``containers``, the in-scope pages."""
        rows = self.client.search(
            self._attachments_cql(space), expand="container,extensions", limit=self.id_limit
        )
        return self._inherit({str(r["id"]): _container_id(r) async for r in rows
                              if self._wanted_attachment(r, containers)})

    async def iter_attachments(self, space: str, *, containers: set[str], since: str | None = None,
                               only: set[str] | None = None) -> AsyncIterator[Page]:
        """The attachments of in-scope pages changed since ``since`` (or those of ``only``, whatever their
        time), each a page of its own: its text as body, its page as breadcrumb. Too large or unreadable ones
        are reported, not indexed."""
        rows = self.client.search(self._attachments_cql(space, since), expand="container,version,extensions",
                                  limit=self.id_limit)
        async for r in rows:
            if not self._wanted_attachment(r, containers) or (
                only is not None and str(r.get("id")) not in only
            ) or (only is None and self._known(r)):
                continue
            page = await self._attachment_or_none(r, space)
            if page is not None:
                yield page

    async def _attachment_or_none(self, r: dict[str, Any], space: str) -> Page | None:
        """The attachment as a page, or None, reported: kept as unusable when it cannot be read as it is (too
        large, no link, refused or gone: this version is settled, the next edit is read again), else left for
        a later cycle (``stats.unread``: a server error, timeout or throttling)."""
        try:
            return await self._attachment_page(r, space)
        except InputError as exc:
            why, final = str(exc), True
        except RemoteError as exc:
            if rejected_credentials(exc):
                raise
            status = exc.status or 0
            final = not isinstance(exc, RateLimitedError | TransientError) and 400 <= status < 500
            why = f"download failed: {exc}"
        pid = str(r.get("id", ""))
        self.stats.failed.append((pid, f"attachment {r.get('title', '')!r}: {why}"))
        if final:
            self.stats.unusable.append((pid, version_time(r)))
        else:
            self.stats.unread.append((space, pid, version_time(r)))
        return None

    def _known(self, r: dict[str, Any]) -> bool:
        """Indexed lately at this very version: nothing to download or read (``known`` versions)."""
        pid = str(r.get("id", ""))
        if pid in self.known and self.known[pid] == version_time(r):
            self.stats.known.add(pid)
            return True
        return False

    def _wanted_attachment(self, r: dict[str, Any], containers: set[str]) -> bool:
        container = str((r.get("container") or {}).get("id", ""))
        return container in containers and Path(str(r.get("title", ""))).suffix.lower() in DOCUMENT_SUFFIXES

    async def _attachment_page(self, r: dict[str, Any], space: str) -> Page:
        name, container = str(r.get("title", "")), r.get("container") or {}
        size = int((r.get("extensions") or {}).get("fileSize") or 0)
        if size > self.max_attachment_bytes:
            raise InputError(
                f"{size} bytes, over CONFLUENCE_MAX_ATTACHMENT_BYTES ({self.max_attachment_bytes})"
            )
        link = str((r.get("_links") or {}).get("download") or "")
        if not link:
            raise InputError("no download link")
        data = await self.client.download(link, max_bytes=self.max_attachment_bytes)
        title, body = await asyncio.to_thread(document_body, Path(name).suffix.lower(), data, name)
        webui = str(((container.get("_links") or {}).get("webui")) or "")
        when = ((r.get("version") or {}).get("when")) or None
        return Page(id=str(r["id"]), title=f"{title} ({name})" if title != name else name,
                    url=self.client.url + webui if webui.startswith("/") else self.client.url,
                    space=space, body=body, ancestors=(str(container.get("title", "")),),
                    updated=to_utc_iso(str(when)) if when else None,
                    access=self.access_of(str(container.get("id", ""))))

    def _comments_cql(self, space: str, since: str | None = None) -> str:
        cql = f"space = {quote(space)} and type = comment"
        return cql + (f" and lastmodified >= {quote(since)}" if since else "") + " order by lastmodified asc"

    async def list_comments(self, space: str, *, containers: set[str]) -> set[str]:
        """Ids of the comments on ``containers``, the in-scope pages (in space mode a restricted page's
        comments never are)."""
        rows = self.client.search(self._comments_cql(space), expand="container", limit=self.id_limit)
        return self._inherit({str(r["id"]): _container_id(r) async for r in rows
                              if _container_id(r) in containers})

    def _inherit(self, container_of: dict[str, str]) -> set[str]:
        """The ids of ``container_of`` (item -> its page); each item may be read by whoever may read its
        page."""
        self.container_of.update(container_of)
        for item, page in container_of.items():
            access = self.access_of(page)
            if access is not None:
                self.access[item] = access
        return set(container_of)

    async def iter_comments(self, space: str, *, containers: set[str], since: str | None = None,
                            only: set[str] | None = None) -> AsyncIterator[Page]:
        """The comments on in-scope pages changed since ``since`` (or those of ``only``, whatever their time),
        each a page of its own: "Comment on <page>", linked to the comment on its page, the page as
        breadcrumb."""
        cql = self._comments_cql(space, since)
        if only is not None:  # comment ids are numeric: ask for just those, 100 a search (bodies included)
            ids = sorted(i for i in only if i.isdigit())
            for n in range(0, len(ids), 100):
                chunk = cql.replace(" order by", f" and id in ({', '.join(ids[n:n + 100])}) order by")
                async for page in self._comments(space, chunk, containers, only):
                    yield page
            return
        async for page in self._comments(space, cql, containers, None):
            yield page

    async def _comments(self, space: str, cql: str, containers: set[str],
                        only: set[str] | None) -> AsyncIterator[Page]:
        """The comments ``cql`` finds on ``containers`` (of ``only``, or changed: known versions skipped)."""
        expand = "container,version" if self.client.v2_bodies else "body.storage,container,version"
        rows = self.client.search(cql, expand=expand, limit=self.page_limit)
        async for r in rows:
            if _container_id(r) not in containers or (only is not None and str(r["id"]) not in only) or (
                    only is None and self._known(r)):
                continue
            if self.client.v2_bodies:  # Cloud: the body from REST v2 (v1 search may refuse to expand it)
                try:
                    r = {**r, "body": {"storage": {"value": await self.client.comment_body(str(r["id"]))}}}
                except NotFoundError:  # deleted since the search: settled at this version (not asked again)
                    self.stats.warnings.append((f"comment:{r['id']}", "not found when its body was read"))
                    self.stats.unusable.append((str(r["id"]), version_time(r)))
                    continue
            container, cid = r.get("container") or {}, str(r["id"])
            webui = str(((container.get("_links") or {}).get("webui")) or "")
            page_url = self.client.url + webui if webui.startswith("/") else self.client.url
            url = f"{page_url}?focusedCommentId={cid}#comment-{cid}"
            when = ((r.get("version") or {}).get("when")) or None
            body = str((((r.get("body") or {}).get("storage")) or {}).get("value") or "")
            yield Page(
                id=cid,
                title=f"Comment on {container.get('title', '')}",
                url=url,
                space=space,
                body=body,
                ancestors=(str(container.get("title", "")),),
                updated=to_utc_iso(str(when)) if when else None,
                access=self.access_of(_container_id(r)),
            )


def _container_id(r: dict[str, Any]) -> str:
    return str((r.get("container") or {}).get("id", ""))
