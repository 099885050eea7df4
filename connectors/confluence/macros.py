"""Macros that Confluence renders at view time, resolved before a page is parsed.

In storage format these macros are empty placeholders, so the text a reader sees is not in the body:

- ``include`` (Include Page): replaced by the included page's storage body;
- ``excerpt-include``: replaced by the body of the ``excerpt`` macro of the named page;
- ``children`` (Children Display): replaced by a list of the child pages' titles.

- ``jira`` naming one issue: "KEY: summary" when a Jira site is configured (``connectors.confluence.jira``;
  one search per page); otherwise the parser keeps the bare key.

Resolution is bounded: included pages are
resolved again up to ``MAX_DEPTH`` levels, a page that includes itself (directly or through others) is
included once, a page holds at most ``MAX_MACROS`` resolved macros, and each fetched page is cached for the
run. An included page the account cannot see, or one with read restrictions (its own or inherited from an
ancestor), contributes nothing: its text must not reach readers through another page. With per-user access an
included page contributes only where everyone who may read the including page may read it too (each of its
permission clauses is one of the includer's); anything else is left out.
"""

from __future__ import annotations

import html
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from pipeline.access.scope import PageAccess
from pipeline.errors import RemoteError

MAX_DEPTH = 3
MAX_MACROS = 50

_MACRO = re.compile(
    r'<ac:structured-macro\b(?P<attrs>[^>]*?\bac:name="(?P<name>include|excerpt-include|children)"[^>]*?)'
    r'(?:/>|>(?P<inner>.*?)</ac:structured-macro>)',
    re.DOTALL | re.IGNORECASE,
)
_PAGE_REF = re.compile(r'<ri:page\b(?P<attrs>[^>]*)/?>', re.IGNORECASE)
_ATTR = re.compile(r'(ri:content-title|ri:space-key)="([^"]*)"')
_EXCERPT = re.compile(
    r'<ac:structured-macro\b[^>]*\bac:name="excerpt"[^>]*>.*?<ac:rich-text-body>(?P<body>.*?)</ac:rich-text-body>',
    re.DOTALL | re.IGNORECASE,
)


@dataclass(frozen=True)
class Linked:
    """A page a macro points at: what the resolver needs from Confluence."""

    page_id: str
    body: str
    restricted: bool  # read restrictions of its own or of an ancestor
    updated: str = ""  # its version's time (UTC ISO) when read, "" if unknown
    access: PageAccess | None = None  # per-user access: who may read it, where known


def covers(reader: PageAccess | None, included: PageAccess | None) -> bool:
    """Whether everyone admitted by ``reader`` is admitted by ``included`` (each clause of ``included`` is one
    of ``reader``'s); unknown on either side: no."""
    if reader is None or included is None:
        return False
    return all(clause in set(reader) for clause in included)


FindPage = Callable[[str, str], Awaitable[Linked | None]]  # (space key, title) -> the page, if visible
ChildTitles = Callable[[str], Awaitable[list[str]]]  # page id -> its children's titles, in order
Summaries = Callable[[list[str]], Awaitable[dict[str, str]]]  # issue keys -> their summaries

_JIRA = re.compile(
    r'<ac:structured-macro\b[^>]*?\bac:name="jira"[^>]*?>(?P<inner>.*?)</ac:structured-macro>',
    re.DOTALL | re.IGNORECASE,
)
_JIRA_KEY = re.compile(
    r'<ac:parameter\b[^>]*\bac:name="key"[^>]*>\s*([^<]+?)\s*</ac:parameter>', re.IGNORECASE
)


@dataclass
class MacroResolver:
    """Resolves the macros of one sync run's pages; ``find_page`` and ``child_titles`` call Confluence."""

    find_page: FindPage
    child_titles: ChildTitles
    summaries: Summaries | None = None
    _pages: dict[tuple[str, str], Linked | None] = field(default_factory=dict)
    resolved: int = 0
    jira_error: RemoteError | None = None  # why the last page's Jira summaries could not be read
    # page id -> {id: version time} of the pages its include / excerpt-include macros showed (nested ones
    # too),
    # for the pages resolved in this run: a newer version of an included page re-fetches its includers
    # (``sync``).
    includes: dict[str, dict[str, str]] = field(default_factory=dict)
    _root: str = ""  # the page being resolved

    def new_run(self) -> None:
        """Forget the pages looked up so far: each sync run sees the included pages as they are now."""
        self._pages.clear()
        self.includes.clear()

    async def resolve(self, body: str, *, page_id: str, space: str, access: PageAccess | None = None,
                      per_user: bool = False) -> str:
        """``body`` with its include, excerpt-include and children macros replaced by what they show
        (``per_user``: only pages everyone who may read it, ``access``, may read)."""
        budget = [MAX_MACROS]
        self._root = page_id
        self._reader, self._per_user = access, per_user
        self.includes[page_id] = {}
        body = await self._resolve(body, page_id=page_id, space=space, depth=0, seen=frozenset({page_id}),
                                   budget=budget)
        self.jira_error = None
        if self.summaries is None:
            return body
        try:
            return await self._jira(body)
        except RemoteError as exc:  # the page keeps its includes; its Jira macros stay as stored
            self.jira_error = exc
            return body

    async def _jira(self, body: str) -> str:
        """Single-issue Jira macros as "KEY: summary" (one search for the page's keys)."""
        found = [(m, _JIRA_KEY.search(m.group("inner"))) for m in _JIRA.finditer(body)]
        keys = [html.unescape(k.group(1)).strip() for _, k in found if k is not None]
        if not keys or self.summaries is None:
            return body
        summaries = await self.summaries(keys)
        parts, last = [], 0
        for m, k in found:
            key = html.unescape(k.group(1)).strip() if k is not None else ""
            if key in summaries:
                parts += [body[last:m.start()], html.escape(f" {key}: {summaries[key]} ")]
                last = m.end()
                self.resolved += 1
        return "".join(parts) + body[last:]

    async def _resolve(self, body: str, *, page_id: str, space: str, depth: int, seen: frozenset[str],
                       budget: list[int]) -> str:
        if "ac:structured-macro" not in body:
            return body
        parts: list[str] = []
        last = 0
        for m in _MACRO.finditer(body):
            parts.append(body[last:m.start()])
            last = m.end()
            if budget[0] <= 0:
                continue
            budget[0] -= 1
            parts.append(
                await self._one(m, page_id=page_id, space=space, depth=depth, seen=seen, budget=budget)
            )
        parts.append(body[last:])
        return "".join(parts)

    async def _one(self, m: re.Match[str], *, page_id: str, space: str, depth: int, seen: frozenset[str],
                   budget: list[int]) -> str:
        name = m.group("name").lower()
        if name == "children":
            titles = await self.child_titles(page_id)
            self.resolved += 1
            return "<ul>" + "".join(f"<li>{html.escape(t)}</li>" for t in titles) + "</ul>" if titles else ""
        ref = _page_ref(m.group("inner") or "", default_space=space)
        if ref is None or depth >= MAX_DEPTH:
            return ""
        linked = await self._page(*ref)
        if linked is not None:
            self.includes[self._root][linked.page_id] = linked.updated
        if linked is None or linked.page_id in seen:
            return ""
        if (not covers(self._reader, linked.access)) if self._per_user else linked.restricted:
            return ""
        content = linked.body
        if name == "excerpt-include":
            found = _EXCERPT.search(content)
            content = found.group("body") if found else ""
        self.resolved += 1
        return await self._resolve(content, page_id=linked.page_id, space=ref[0], depth=depth + 1,
                                   seen=seen | {linked.page_id}, budget=budget)

    async def _page(self, space: str, title: str) -> Linked | None:
        key = (space, title)
        if key not in self._pages:
            self._pages[key] = await self.find_page(space, title)
        return self._pages[key]


def _page_ref(inner: str, *, default_space: str) -> tuple[str, str] | None:
    """(space key, title) of the ``ri:page`` a macro names; the macro's own space when it names none."""
    found = _PAGE_REF.search(inner)
    if found is None:
        return None
    attrs = dict(_ATTR.findall(found.group("attrs")))
    title = html.unescape(attrs.get("ri:content-title", "")).strip()
    if not title:
        return None
    return html.unescape(attrs.get("ri:space-key", "")).strip() or default_space, title
