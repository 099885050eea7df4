"""``ConfluenceSource``: the in-scope pages of some Confluence spaces, as ``pipeline.types.Page``.

Scope = space keys, optional label include/exclude lists and an optional ancestor subtree, all pushed
into CQL. Read-restricted pages are skipped (and counted) unless ``include_restricted``: the bot shows
answers to whole channels, so a page only some people may read must not become evidence. Restrictions
come with the same CQL responses through ``expand`` (no extra request per page). A page also counts
as restricted when one of its ancestors has read restrictions (Confluence inherits them); those
ancestors are learnt from the space listing, so restricted ancestors *outside* the configured scope
(e.g. without an included label) are not seen.

With per-user access (``permissions``: ``EVIDENT_ACCESS=per-user``) restricted pages are indexed too, each
with who may read it (``connectors.confluence.permissions``); attachments and comments take their page's.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from connectors.confluence.client import ConfluenceClient, storage_of
from connectors.confluence.cql import (
    EXPAND_META,
    EXPAND_PAGE,
    EXPAND_RESTRICTIONS,
    pages_cql,
    quote,
    to_utc_iso,
    version_time,
)
from connectors.confluence.extras import PageExtras
from connectors.confluence.jira import JiraClient
from connectors.confluence.macros import Linked, MacroResolver
from connectors.confluence.permissions import PermissionSweep
from pipeline.access.scope import PageAccess
from pipeline.errors import InputError, RemoteError
from pipeline.ingest.pages import page_from_record
from pipeline.types import Page


@dataclass
class SourceStats:
    """What the source skipped on purpose or could not convert, for the sync report."""

    skipped_restricted: set[str] = field(default_factory=set)
    known: set[str] = field(default_factory=set)  # re-read at a version already indexed: no body fetched
    # (id, version time) that failed to convert
    unusable: list[tuple[str, str | None]] = field(default_factory=list)
    failed: list[tuple[str, str]] = field(default_factory=list)
    warnings: list[tuple[str, str]] = field(default_factory=list)
    # "comments:ENG": a listing refused this run (not fetched)
    unlisted: set[str] = field(default_factory=set)
    # (space, id, version time) of attachments to read again later (a server error or timeout on them)
    unread: list[tuple[str, str, str | None]] = field(default_factory=list)
    # spaces whose search served a row twice (an edit while it paged may have hidden another row)
    unstable: set[str] = field(default_factory=set)


class ConfluenceSource(PageExtras):
    """Confluence Cloud or Data Center as a ``pipeline.protocols.SourceConnector``."""

    name = "confluence"

    def __init__(
        self,
        client: ConfluenceClient,
        *,
        spaces: Sequence[str],
        labels_include: Sequence[str] = (),
        labels_exclude: Sequence[str] = (),
        ancestor: str | None = None,
        include_restricted: bool = False,
        page_limit: int = 50,
        id_limit: int = 200,
        overlap_s: int = 600,
        zone_probe: bool = True,
        blog_posts: bool = False,
        resolve_macros: bool = True,
        attachments: bool = False,
        max_attachment_bytes: int = 20 * 2**20,
        comments: bool = False,
        jira: JiraClient | None = None,
        permissions: PermissionSweep | None = None,
        listing_interval_s: float = 0.0,
    ) -> None:
        self.client = client
        self.spaces = tuple(spaces)
        self.labels_include = tuple(labels_include)
        self.labels_exclude = tuple(labels_exclude)
        self.ancestor = ancestor
        self.include_restricted = include_restricted
        self.page_limit = page_limit
        self.id_limit = id_limit
        self.overlap_s = overlap_s
        self.listing_interval_s = listing_interval_s  # 0: every cycle lists (``confluence.schedule``)
        self.zone_probe = zone_probe
        self.blog_posts = blog_posts
        self.attachments = attachments
        self.max_attachment_bytes = max_attachment_bytes
        self.comments = comments
        self.macros = MacroResolver(self._find_page, self._child_titles,
                                    jira.summaries if jira is not None else None) if resolve_macros else None
        self.stats = SourceStats()
        self.known: dict[str, str] = {}  # page id -> version time indexed lately (the sync sets it per space)
        self.container_of: dict[str, str] = {}
        self._restricted: dict[str, set[str]] = {}  # space -> ids with own read restrictions
        self._ancestor_restricted: dict[str, bool] = {}  # ancestor outside the listings -> restricted
        # per-user access: restricted pages are indexed, each with who may read it (page id -> access)
        self.permissions = permissions
        self.access: dict[str, PageAccess] = {}

    def restricted_ids(self, space: str) -> set[str]:
        """The pages of ``space`` with read restrictions of their own, as its last listing found them."""
        return set(self._restricted.get(space, ()))

    def assume_restricted(self, space: str, ids: set[str]) -> None:
        """Take ``ids`` as the pages of ``space`` with own read restrictions (kept from an earlier
        listing), so reading its changed pages needs no listing."""
        self._restricted[space] = set(ids)

    def new_cycle(self) -> None:
        """Forget what an earlier cycle learnt about restrictions (they change)."""
        self._ancestor_restricted.clear()
        self._restricted.clear()
        self.container_of.clear()

    @property
    def source_key(self) -> str:
        """Checkpoint namespace: one per site, so two sites never share checkpoints."""
        return f"confluence:{self.client.url}"

    def scope_cql(self, space: str) -> str:
        """The CQL of ``space``'s in-scope pages, unordered (to add clauses or an order to)."""
        return self._cql(space, ordered=False)

    def _cql(self, space: str, *, since: str | None = None, ordered: bool = True) -> str:
        return pages_cql(space, since=since, labels_include=self.labels_include,
                         labels_exclude=self.labels_exclude, ancestor=self.ancestor, ordered=ordered,
                         blog_posts=self.blog_posts)

    async def check_space(self, space: str) -> None:
        """Fail early with ``NotFoundError("space 'X' not found ...")`` / ``AuthError`` /
        ``UnreachableError``."""
        await self.client.space(space)

    async def list_space(self, space: str) -> set[str]:
        """Ids of the in-scope pages of ``space`` that may be indexed (restricted ones left out).

        Cheap: no bodies, large pages of results; restrictions and ancestor ids are expanded only when
        restricted pages must be excluded.
        """
        keep = self.include_restricted and self.permissions is None
        expand = None if keep else f"ancestors,{EXPAND_RESTRICTIONS}"
        rows = [r async for r in self.client.search(self._cql(space, ordered=False), expand=expand,
                                                    limit=self.id_limit)]
        if self.permissions is not None:
            self.access |= await self.permissions.page_accesses(space, rows)
            return {str(r["id"]) for r in rows}
        if keep:
            return {str(r["id"]) for r in rows}
        own = {str(r["id"]) for r in rows if _has_read_restrictions(r)}
        self._restricted[space] = own
        return {str(r["id"]) for r in rows if not self._is_restricted(r, own)}

    async def iter_space(self, space: str, *, since: str | None = None) -> AsyncIterator[Page]:
        """In-scope pages of ``space`` (modified since the ``since`` CQL bound), oldest edit first. With
        ``since``, pages at the version time ``known`` says is indexed are left out (no body read;
        ``stats.known``)."""
        async for page in self._iter_cql(space, self._cql(space, since=since), skip_known=since is not None):
            yield page

    async def iter_ids(self, space: str, page_ids: Sequence[str], *, chunk: int = 100) -> AsyncIterator[Page]:
        """Those of ``page_ids`` that are in-scope pages of ``space``, whatever their edit time (e.g. pages
        moved into the space: a move does not have to change ``lastmodified``)."""
        ids = [i for i in page_ids if i.isdigit()]
        for n in range(0, len(ids), chunk):
            cql = self._cql(space, ordered=False) + f" and id in ({', '.join(ids[n:n + chunk])})"
            async for page in self._iter_cql(space, cql):
                yield page

    async def _iter_cql(self, space: str, cql: str, *, skip_known: bool = False) -> AsyncIterator[Page]:
        """The pages ``cql`` selects, in its order. On Cloud the search carries only what REST v2 has no
        equivalent for (the selection, ancestor titles, labels, read restrictions) and the bodies come from
        REST v2 per results page (``ConfluenceClient.storage_bodies``); Data Center expands them in the
        search."""
        expand = EXPAND_META if self.client.v2_bodies else EXPAND_PAGE
        drop = not self.include_restricted and self.permissions is None  # per-user access keeps them
        if drop:
            expand = f"{expand},{EXPAND_RESTRICTIONS}"
            if space not in self._restricted:
                await self.list_space(space)
        own = self._restricted.get(space, set())
        batch: list[dict[str, Any]] = []
        served: set[str] = set()  # rows skipped below count too: an edit moves a row whatever became of it
        async for r in self.client.search(cql, expand=expand, limit=self.page_limit):
            pid = str(r.get("id", ""))
            if pid in served:
                self.stats.unstable.add(space)
            served.add(pid)
            if drop and self._is_restricted(r, own):
                self.stats.skipped_restricted.add(pid)
                continue
            if skip_known and pid in self.known and self.known[pid] == version_time(r):
                self.stats.known.add(pid)
                continue
            batch.append(r)
            if len(batch) >= self.page_limit:
                async for page in self._pages_of(batch):
                    yield page
                batch = []
        async for page in self._pages_of(batch):
            yield page

    async def _pages_of(self, rows: list[dict[str, Any]]) -> AsyncIterator[Page]:
        """``rows`` (search results) as pages, in order, with their bodies from REST v2 on Cloud."""
        bare = [r for r in rows if storage_of(r) is None] if self.client.cloud else []
        missing: set[str] = set()
        if bare:
            bodies: dict[str, str] = {}
            for kind in ("page", "blogpost"):
                ids = [str(r.get("id", "")) for r in bare if (r.get("type") or "page") == kind]
                if ids:
                    bodies |= await self.client.storage_bodies(kind, ids)
            missing = {str(r.get("id", "")) for r in bare} - bodies.keys()
            rows = [_with_body(r, bodies) if storage_of(r) is None else r for r in rows]
        for r in rows:
            pid = str(r.get("id", ""))
            if pid in missing:  # no body served: deleted or moved since the search
                self.stats.warnings.append((pid, "page not found when its body was read; the next sync "
                                                 "removes or moves it"))
                continue
            try:
                page = replace(to_page(r, self.client.url), access=self.access_of(pid))
            except InputError as exc:
                self.stats.failed.append((pid, str(exc)))
                self.stats.unusable.append((pid, version_time(r)))
                continue
            yield await self._with_macros(page)

    async def _with_macros(self, page: Page) -> Page:
        """The page with its include, excerpt-include and children macros resolved (``macros``); a page whose
        macros cannot be resolved now is indexed as stored, with a warning."""
        if self.macros is None:
            return page
        if "ac:structured-macro" not in page.body:
            self.macros.includes[page.id] = {}  # it includes nothing (any more)
            return page
        try:
            body = await self.macros.resolve(page.body, page_id=page.id, space=page.space, access=page.access,
                                             per_user=self.permissions is not None)
            if (jira := self.macros.jira_error) is not None:  # keyed apart from the page: not read again
                self.stats.warnings.append((f"jira:{page.id}", f"Jira summaries not read: {jira}"))
            return replace(page, body=body)
        except RemoteError as exc:
            self.stats.warnings.append((page.id, f"macros not resolved: {exc}"))
            return page

    async def _find_page(self, space: str, title: str) -> Linked | None:
        cql = f"space = {quote(space)} and type = page and title = {quote(title)}"
        body_expand = "" if self.client.v2_bodies else "body.storage,"  # Cloud: the body from REST v2
        expand = f"{body_expand}version,ancestors,{EXPAND_RESTRICTIONS}"
        async for r in self.client.search(cql, expand=expand, limit=1):
            if storage_of(r) is None:
                r = _with_body(r, await self.client.storage_bodies("page", [str(r.get("id", ""))]))
            body = storage_of(r) or ""
            when = ((r.get("version") or {}).get("when")) or None
            pid = str(r.get("id", ""))
            if self.permissions is not None:  # per-user access: the included page's own permissions decide
                return Linked(pid, body, True, to_utc_iso(str(when)) if when else "", self.access.get(pid))
            restricted = await self._inherits_restrictions(r, space)
            return Linked(pid, body, restricted, to_utc_iso(str(when)) if when else "")
        return None

    async def _inherits_restrictions(self, r: dict[str, Any], space: str) -> bool:
        """Read restrictions on the page or any ancestor (those of listed spaces are known; others are read
        by id, once per page)."""
        if _has_read_restrictions(r):
            return True
        own = self._restricted.get(space)
        for a in r.get("ancestors") or ():
            aid = str(a.get("id", ""))
            if own is not None:
                if aid in own:
                    return True
                continue
            if aid not in self._ancestor_restricted:
                try:
                    row = await self.client.get(f"rest/api/content/{aid}", {"expand": EXPAND_RESTRICTIONS})
                    self._ancestor_restricted[aid] = _has_read_restrictions(row)
                except RemoteError:
                    self._ancestor_restricted[aid] = True  # not readable: treated as restricted
            if self._ancestor_restricted[aid]:
                return True
        return False

    async def _child_titles(self, page_id: str) -> list[str]:
        if not page_id.isdigit():
            return []
        rows = [r async for r in self.client.search(f"type = page and parent = {page_id}",
                                                    expand=EXPAND_RESTRICTIONS, limit=self.id_limit)]
        return [str(r.get("title", "")) for r in rows if not _has_read_restrictions(r) and r.get("title")]

    @property
    def failures(self) -> list[tuple[str, str]]:
        """Pages of this run that could not be converted (page id, why)."""
        return list(self.stats.failed)

    async def iter_pages(self) -> AsyncIterator[Page]:
        """Every in-scope page of every configured space (a full read)."""
        for space in self.spaces:
            async for page in self.iter_space(space):
                yield page

    async def list_page_ids(self) -> set[str]:
        out: set[str] = set()
        for space in self.spaces:
            out |= await self.list_space(space)
        return out

    def access_of(self, page_id: str) -> PageAccess | None:
        """Who may read a page (per-user access: as listed this cycle; a page not listed is not known);
        None in space mode, where restricted pages are not indexed."""
        return self.access.get(page_id) if self.permissions is not None else None

    def passes_over(self, r: dict[str, Any], space: str, pages: set[str]) -> bool:
        """Whether a sync would leave search result ``r`` out without indexing or removing anything, ``pages``
        being the space's indexed pages: an attachment that is no document or whose page is not indexed, a
        comment on a page not indexed, a page with read restrictions (own or inherited) that is not indexed
        (space mode), a page outside the configured labels or ancestor (the incremental query leaves it out).
        Anything else may change the index."""
        kind, pid = r.get("type") or "page", str(r.get("id", ""))
        if kind == "attachment":
            return not self._wanted_attachment(r, pages)
        if kind == "comment":
            return _container(r) not in pages
        if not self._in_scope(r):
            return True
        drop = not self.include_restricted and self.permissions is None
        return drop and pid not in pages and self._is_restricted(r, self._restricted.get(space, set()))

    def _in_scope(self, r: dict[str, Any]) -> bool:
        """Whether a page (expanded with ``metadata.labels`` and ``ancestors``) has the configured labels and
        lies under the configured ancestor, as ``pages_cql`` selects."""
        labels = {str(lb.get("name", "")) for lb in
                  (((r.get("metadata") or {}).get("labels") or {}).get("results") or [])}
        # in case CQL matches labels without case: in scope when it might be (a change then asks again)
        folded = {v.casefold() for v in labels}
        if self.labels_include and not folded & {v.casefold() for v in self.labels_include}:
            return False
        if labels & set(self.labels_exclude):
            return False
        return not self.ancestor or self.ancestor in {str(a.get("id", "")) for a in r.get("ancestors") or []}

    def _is_restricted(self, r: dict[str, Any], own: set[str]) -> bool:
        if _has_read_restrictions(r):
            return True
        return any(str(a.get("id")) in own for a in r.get("ancestors") or [])

    def close(self) -> None:
        self.client.close()


def _container(r: dict[str, Any]) -> str:
    return str((r.get("container") or {}).get("id", ""))


def _with_body(r: dict[str, Any], bodies: dict[str, str]) -> dict[str, Any]:
    """A search result with the storage body REST v2 served for it (``body`` absent when none was)."""
    body = bodies.get(str(r.get("id", "")))
    if body is None:
        return {k: v for k, v in r.items() if k != "body"}
    return {**r, "body": {"storage": {"value": body, "representation": "storage"}}}


def _has_read_restrictions(r: dict[str, Any]) -> bool:
    read = (((r.get("restrictions") or {}).get("read") or {}).get("restrictions")) or {}
    return any(((read.get(kind) or {}).get("results")) for kind in ("user", "group"))


def to_page(r: dict[str, Any], site_url: str) -> Page:
    """Convert one ``content`` JSON object (expanded with ``EXPAND_PAGE``) into a ``Page``.

    Validation is the page schema's (``pipeline.ingest.pages``); here only the time becomes UTC.
    """
    pid = str(r.get("id", "")) if isinstance(r, dict) else ""
    try:
        page = page_from_record(r, site_url=site_url)
    except InputError as exc:
        raise InputError(f"page {pid or '?'}: {exc}") from exc
    page = replace(page, updated=to_utc_iso(page.updated) if page.updated else None)
    if r.get("type") == "blogpost":  # a blog post: its own kind, shown in the breadcrumb of its evidence
        page = replace(page, ancestors=("Blog",))
    return page
