"""A local fake Confluence REST server (aiohttp on 127.0.0.1) for tests and benchmarks.

It speaks the v1 REST wire format that ``connectors.confluence`` calls through atlassian-python-api:
``GET {context}/rest/api/content/search`` (CQL, expand, start/limit, ``_links.next``),
``GET {context}/rest/api/space/{key}``, ``GET {context}/rest/api/content/{id}`` and
``GET {context}/rest/api/content/{id}/restriction/byOperation``, and on Cloud REST v2's ``/api/v2/spaces``
(by ``keys``), ``/api/v2/pages`` and ``/api/v2/blogposts`` (by ``id``/``space-id``, ``body-format=storage``,
cursor paging). Anything else under the host answers
a 404 HTML page, like a Cloud site asked for ``/rest/api`` without ``/wiki``.

CQL subset: ``and``-joined clauses over ``space``, ``type``, ``ancestor``, ``label`` (``=``, ``!=``,
``in``, ``not in``), ``id`` and ``lastmodified`` (``>=``, ``>``, ``<=``, ``<``, ``=``) plus
``order by lastmodified [asc|desc]``. Like Confluence, ``lastmodified`` literals are read in the
server user's time zone (``tz_offset_min``) at minute precision. Unsupported CQL answers 400.

Knobs: ``v1_retired`` (no v1 space endpoint), ``v1_bodies_retired`` (v1 search refuses body expansion),
``v2_pages`` (False: no v2 page/blog post endpoints);
``edit``/``add``/``delete``/``archive``/``restrict``/``set_labels``/``set_parent``; faults via
``fail_next`` (status, count, headers: 429 + Retry-After, DC's throttling 403, 500...),
``fail_every`` (intermittent) and ``fail_search_containing`` (a results page holding a given page
fails, as a crash mid-sync), ``slow_next`` (timeouts); ``api_calls`` counts every request, ``requests`` keeps
their paths.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlencode

import numpy as np
from aiohttp import web

from tests.fake_confluence_people import SiteDirectory
from tests.fake_confluence_people import add_routes as add_people_routes

REPO = Path(__file__).resolve().parent.parent
CONFQ_DOCS = REPO.parent / "shared" / "confquestions" / "documents"
SAMPLE_DOCS = REPO / "connectors" / "sample_space"
BASE_TIME = datetime(2024, 11, 15, tzinfo=UTC)


@dataclass
class FakePage:
    id: str
    title: str
    space: str
    body: str
    when: datetime  # UTC
    version: int = 1
    labels: list[str] = field(default_factory=list)
    parent: str | None = None
    restricted_users: list[str] = field(default_factory=list)
    restricted_groups: list[str] = field(default_factory=list)
    status: str = "current"
    kind: str = "page"  # or "blogpost", or "attachment" (then ``parent`` is its page, ``data`` its bytes)
    data: bytes = b""
    media_type: str = ""


@dataclass
class _Fault:
    status: int
    remaining: int | None  # None = forever
    headers: dict[str, str]
    path_contains: str | None = None


def synthetic_pages(per_space: int, spaces: Iterable[str] = ("ENG", "OPS"),
                    folder: Path | None = None) -> list[FakePage]:
    """``per_space`` pages in each of ``spaces``, bodies cycled from the documents (for small corpora)."""
    docs = load_pages(folder)
    if not docs:
        return []
    out: list[FakePage] = []
    for s_i, space in enumerate(spaces):
        for i in range(per_space):
            d = docs[(s_i * per_space + i) % len(docs)]
            n = len(out)
            out.append(FakePage(id=str(800000 + n), title=f"{d.title} ({space} {i + 1})", space=space,
                                body=d.body + f"<p>Copy {n}.</p>", when=BASE_TIME + timedelta(minutes=7 * n)))
    return out


class HashEmbedder:
    """Deterministic 16-d embedder (a hash of the text) for sync tests/benchmarks: no model, no download."""

    name = "test-hash-16"
    dim = 16

    def _vec(self, text: str) -> np.ndarray:
        v = (
            np.frombuffer(hashlib.sha256(text.encode()).digest()[:16], dtype=np.uint8).astype(np.float32)
            - 127.5
        )
        return v / (np.linalg.norm(v) or 1.0)

    def embed_documents(self, texts: Sequence[str]) -> np.ndarray:
        return np.stack([self._vec(t) for t in texts]) if texts else np.zeros((0, 16), np.float32)

    def close(self) -> None:
        pass

    def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        return self.embed_documents(texts)


class CQLError(ValueError):
    pass


def documents_dir() -> Path:
    """ConfQuestions documents when present (read in place, never copied), else the sample space."""
    return CONFQ_DOCS if CONFQ_DOCS.is_dir() else SAMPLE_DOCS


def load_pages(folder: Path | None = None, *, limit: int | None = None,
               spaces: Iterable[str] | None = None) -> list[FakePage]:
    """ConfQuestions-shaped JSON files -> fake pages with real-looking numeric ids and distinct times."""
    folder = folder or documents_dir()
    wanted = set(spaces) if spaces else None
    out: list[FakePage] = []
    used: set[str] = set()
    for i, path in enumerate(sorted(folder.glob("*.json"))):
        doc = json.loads(path.read_text(encoding="utf-8"))
        if wanted is not None and doc.get("space") not in wanted:
            continue
        m = re.search(r"/pages/(\d+)", str(doc.get("url", "")))
        pid = m.group(1) if m and m.group(1) not in used else str(900000 + i)
        used.add(pid)
        out.append(
            FakePage(
                id=pid,
                title=str(doc.get("title") or path.stem),
                space=str(doc.get("space") or "DOCS"),
                body=str(doc.get("content") or ""),
                when=BASE_TIME + timedelta(minutes=7 * i),
            )
        )
        if limit is not None and len(out) >= limit:
            break
    return out


class FakeConfluence:
    """The server. ``mode="cloud"`` serves under ``/wiki`` with Basic auth; ``"dc"`` at the root (or under
    ``context``, e.g. ``/confluence``) with Bearer."""

    def __init__(
        self,
        pages: Iterable[FakePage],
        *,
        mode: Literal["cloud", "dc"] = "dc",
        user: str = "bot@example.com",
        token: str = "s3cret-token",
        tz_offset_min: int = 0,
        context: str | None = None,
        directory: SiteDirectory | None = None,
    ) -> None:
        self.pages: dict[str, FakePage] = {p.id: p for p in pages}
        self.directory = directory  # people, groups and space permissions (``fake_confluence_people``)
        self.mode = mode
        self.user = user
        self.token = token
        self.tz = timezone(timedelta(minutes=tz_offset_min))
        self.context = context if context is not None else ("/wiki" if mode == "cloud" else "")
        self.api_calls = 0
        self.requests: list[str] = []
        self._faults: list[_Fault] = []
        self._every: tuple[int, int] | None = None
        self._search_fail: dict[str, int | None] = {}
        self._slow: list[float] = []
        self.v1_retired = False  # Cloud without REST v1's space endpoint (as Atlassian retires it)
        # Cloud whose v1 search refuses ``expand=body.storage`` (bodies: REST v2)
        self.v1_bodies_retired = False
        self.v2_pages = True  # Cloud serves REST v2 ``/pages`` and ``/blogposts``
        self.v2_page_cap = 250  # most results per REST v2 response (smaller: the cursor is followed)
        self.on_request: Any = None  # called with each request's path and query before it is answered
        self._runner: web.AppRunner | None = None
        self.port = 0

    # ------------------------------------------------------------------ lifecycle

    async def start(self, port: int = 0) -> str:
        """Serve on ``port`` of 127.0.0.1 (0: a free one); returns the base URL."""
        app = web.Application(middlewares=[self._middleware])
        api = self.context + "/rest/api"
        if self.directory is not None:
            add_people_routes(app, self)
        app.router.add_get(api + "/content/search", self._search)
        app.router.add_get(api + "/space/{key}", self._space)
        app.router.add_get(api + "/content/{id}/restriction/byOperation", self._restrictions)
        app.router.add_get(api + "/content/{id}", self._content)
        app.router.add_get(self.context + "/api/v2/spaces", self._spaces_v2)
        app.router.add_get(self.context + "/api/v2/pages", self._contents_v2)
        app.router.add_get(self.context + "/api/v2/blogposts", self._contents_v2)
        app.router.add_get(self.context + "/api/v2/footer-comments/{id}", self._comment_v2)
        app.router.add_get(self.context + "/download/attachments/{pid}/{name}", self._download)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", port)
        await site.start()
        self.port = int(self._runner.addresses[0][1])
        return self.url

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> FakeConfluence:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def host_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        """The site URL a client is configured with (Cloud: ends in ``/wiki``)."""
        return self.host_url + self.context

    # ------------------------------------------------------------------ knobs

    def now(self) -> datetime:
        return datetime.now(UTC)

    def edit(self, page_id: str, *, body: str | None = None, title: str | None = None,
             when: datetime | None = None) -> FakePage:
        p = self.pages[page_id]
        if body is not None:
            p.body = body
        if title is not None:
            p.title = title
        p.version += 1
        p.when = (when or self.now()).astimezone(UTC)
        return p

    def add(self, page: FakePage) -> None:
        self.pages[page.id] = page

    def delete(self, page_id: str) -> None:
        del self.pages[page_id]

    def archive(self, page_id: str) -> None:
        self.pages[page_id].status = "archived"

    def restrict(
        self, page_id: str, *, users: Iterable[str] = ("alice",), groups: Iterable[str] = ()
    ) -> None:
        p = self.pages[page_id]
        p.restricted_users, p.restricted_groups = list(users), list(groups)

    def set_labels(self, page_id: str, labels: Iterable[str]) -> None:
        self.pages[page_id].labels = list(labels)

    def move(self, page_id: str, space: str, *, parent_id: str | None = None) -> None:
        """Move a page to another space (as Confluence does: version and ``lastmodified`` unchanged)."""
        p = self.pages[page_id]
        p.space, p.parent = space, parent_id
        for child in self.pages.values():  # its attachments and comments move with it
            if child.kind in ("attachment", "comment") and child.parent == page_id:
                child.space = space

    def set_parent(self, page_id: str, parent_id: str | None) -> None:
        self.pages[page_id].parent = parent_id

    def fail_next(self, status: int, count: int = 1, *, headers: dict[str, str] | None = None,
                  path_contains: str | None = None) -> None:
        """The next ``count`` matching requests answer ``status`` (e.g. 429 with ``Retry-After``)."""
        self._faults.append(_Fault(status, count, dict(headers or {}), path_contains))

    def slow_next(self, count: int, seconds: float) -> None:
        """The next ``count`` requests answer only after ``seconds`` (client timeouts)."""
        self._slow.extend([seconds] * count)

    def fail_every(self, n: int, status: int = 500) -> None:
        """Every ``n``-th request answers ``status`` (intermittent failures); ``n=0`` turns it off."""
        self._every = (n, status) if n else None

    def fail_search_containing(self, page_id: str, times: int | None = None) -> None:
        """Search requests whose result window holds ``page_id`` with a body answer 500 (``None`` =
        always)."""
        if times == 0:
            self._search_fail.pop(page_id, None)
        else:
            self._search_fail[page_id] = times

    def spaces(self) -> set[str]:
        return {p.space for p in self.pages.values()}

    @staticmethod
    def space_id(key: str) -> str:
        return _space_id(key)

    def visible_ids(self, space: str | None = None) -> set[str]:
        return {p.id for p in self.pages.values()
                if p.status == "current" and p.kind not in ("attachment", "comment")
                and (space is None or p.space == space)}

    # ------------------------------------------------------------------ plumbing

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Any) -> web.StreamResponse:
        self.api_calls += 1
        self.requests.append(request.path_qs)
        if self.on_request is not None:
            self.on_request(request.path_qs)
        if self._slow:
            await asyncio.sleep(self._slow.pop(0))
        v2 = self.mode == "cloud" and request.path.startswith(self.context + "/api/v2/") and (
            self.v2_pages or request.path.startswith(self.context + "/api/v2/spaces"))
        retired = self.v1_retired and request.path.startswith(self.context + "/rest/api/space")
        download = request.path.startswith(self.context + "/download/")
        rpc = self.directory is not None and request.path.startswith(self.context + "/rpc/json-rpc/")
        if retired or not (v2 or download or rpc or request.path.startswith(self.context + "/rest/api/")):
            return web.Response(status=404, text="<html><body><h1>Page not found</h1></body></html>",
                                content_type="text/html")
        if not self._authorized(request.headers.get("Authorization", "")):
            return _json({"statusCode": 401, "message": "Basic authentication with passwords is deprecated"
                          if self.mode == "cloud" else "Authentication failed"}, 401)
        for fault in self._faults:
            if fault.remaining != 0 and (
                fault.path_contains is None or fault.path_contains in request.path_qs
            ):
                if fault.remaining is not None:
                    fault.remaining -= 1
                return _json({"statusCode": fault.status, "message": "injected fault"}, fault.status,
                             headers=fault.headers)
        self._faults = [f for f in self._faults if f.remaining != 0]
        if self._every and self.api_calls % self._every[0] == 0:
            return _json(
                {"statusCode": self._every[1], "message": "injected intermittent fault"}, self._every[1]
            )
        try:
            resp: web.StreamResponse = await handler(request)
        except CQLError as exc:
            return _json({"statusCode": 400, "message": f"Could not parse cql : {exc}"}, 400)
        return resp

    def _authorized(self, header: str) -> bool:
        if self.mode == "dc":
            return header == f"Bearer {self.token}"
        expected = base64.b64encode(f"{self.user}:{self.token}".encode()).decode()
        return header == f"Basic {expected}"

    def _links(self) -> dict[str, str]:
        return {"base": self.url, "context": self.context}

    def _render(self, p: FakePage, expand: set[str]) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": p.id,
            "type": p.kind,
            "status": p.status,
            "title": p.title,
            "_links": {
                "webui": f"/spaces/{p.space}/pages/{p.id}",
                "self": f"{self.url}/rest/api/content/{p.id}",
                "tinyui": f"/x/{p.id}",
            },
            "_expandable": {},
        }
        if p.kind in ("attachment", "comment"):
            container = self.pages[p.parent or ""]
            out["container"] = {"id": container.id, "type": container.kind, "title": container.title,
                                "_links": {"webui": f"/spaces/{container.space}/pages/{container.id}"}}
        if p.kind == "attachment":
            out["extensions"] = {"mediaType": p.media_type, "fileSize": len(p.data)}
            out["_links"]["download"] = f"/download/attachments/{container.id}/{p.title}?version={p.version}"
        if "space" in expand:
            out["space"] = {"key": p.space, "name": p.space, "type": "global"}
        if "version" in expand:
            out["version"] = {"number": p.version, "when": _stamp(p.when, self.tz), "minorEdit": False}
        if "body.storage" in expand:
            out["body"] = {"storage": {"value": p.body, "representation": "storage"}}
        if "ancestors" in expand:
            out["ancestors"] = [{"id": a.id, "type": "page", "title": a.title} for a in self._ancestors(p)]
        if "metadata.labels" in expand:
            out["metadata"] = {
                "labels": {
                    "results": [
                        {"prefix": "global", "name": n, "id": str(abs(hash(n)) % 10**8)} for n in p.labels
                    ],
                    "start": 0,
                    "limit": 200,
                    "size": len(p.labels),
                }
            }
        restr: dict[str, Any] = {}
        d, cloud = self.directory, self.mode == "cloud"
        if "restrictions.read.restrictions.user" in expand:
            users = [d.render_user(u, cloud) if d else {"type": "known", "username": u, "displayName": u}
                     for u in p.restricted_users]
            restr["user"] = {"results": users, "size": len(users)}
        if "restrictions.read.restrictions.group" in expand:
            groups = [
                d.render_group(g, cloud) if d else {"type": "group", "name": g} for g in p.restricted_groups
            ]
            restr["group"] = {"results": groups, "size": len(groups)}
        if restr:
            out["restrictions"] = {"read": {"operation": "read", "restrictions": restr}}
        return out

    def _ancestors(self, p: FakePage) -> list[FakePage]:
        chain: list[FakePage] = []
        cur = p.parent
        while cur is not None and cur in self.pages and len(chain) < 50:
            chain.append(self.pages[cur])
            cur = self.pages[cur].parent
        return list(reversed(chain))

    # ------------------------------------------------------------------ handlers

    async def _search(self, request: web.Request) -> web.Response:
        cql = request.query.get("cql", "")
        expand = _expand(request.query.get("expand", ""))
        if self.v1_bodies_retired and "body.storage" in expand:
            return _json(
                {"statusCode": 400, "message": "expand body.storage is not supported; use REST v2"}, 400
            )
        start = int(request.query.get("start", "0"))
        cap = 50 if "body.storage" in expand else 1000
        limit = max(1, min(int(request.query.get("limit", "25")), cap))
        matches = self._run_cql(cql)
        window = matches[start:start + limit]
        if "body.storage" in expand:
            for p in window:
                if p.id in self._search_fail:
                    left = self._search_fail[p.id]
                    if left is not None:
                        self._search_fail[p.id] = left - 1
                        if left - 1 <= 0:
                            del self._search_fail[p.id]
                    return _json({"statusCode": 500, "message": "injected crash while rendering"}, 500)
        links = self._links()
        query = {k: v for k, v in request.query.items() if k not in ("start", "limit")}
        links["self"] = f"{self.url}/rest/api/content/search?{urlencode(request.query)}"
        if start + limit < len(matches):
            links["next"] = "/rest/api/content/search?" + urlencode({**query, "start": start + limit,
                                                                     "limit": limit})
        return _json({"results": [self._render(p, expand) for p in window], "start": start, "limit": limit,
                      "size": len(window), "_links": links})

    def attach(
        self,
        att_id: str,
        page_id: str,
        name: str,
        data: bytes,
        *,
        media_type: str = "application/pdf",
        when: datetime | None = None,
    ) -> FakePage:
        """Attach a file to a page (an attachment is content of its own: ``att…`` id, version, time)."""
        page = self.pages[page_id]
        att = FakePage(
            id=att_id,
            title=name,
            space=page.space,
            body="",
            when=(when or self.now()).astimezone(UTC),
            kind="attachment",
            parent=page_id,
            data=data,
            media_type=media_type,
        )
        self.pages[att_id] = att
        return att

    def comment(self, comment_id: str, page_id: str, body: str, *, when: datetime | None = None) -> FakePage:
        """Comment on a page (content of its own, numeric id like a page's; its page is the container)."""
        page = self.pages[page_id]
        note = FakePage(id=comment_id, title=f"Re: {page.title}", space=page.space, body=body,
                        when=(when or self.now()).astimezone(UTC), kind="comment", parent=page_id)
        self.pages[comment_id] = note
        return note

    async def _download(self, request: web.Request) -> web.Response:
        for p in self.pages.values():
            if (
                p.kind == "attachment"
                and p.parent == request.match_info["pid"]
                and p.title == request.match_info["name"]
            ):
                return web.Response(body=p.data, content_type=p.media_type or "application/octet-stream")
        return web.Response(status=404, text="no such attachment")

    async def _comment_v2(self, request: web.Request) -> web.Response:
        """REST v2 ``GET /footer-comments/{id}?body-format=storage``."""
        p = self.pages.get(request.match_info["id"])
        if p is None or p.kind != "comment":
            return _json({"errors": [{"status": 404, "title": "NOT_FOUND"}]}, 404)
        item: dict[str, Any] = {"id": p.id, "pageId": p.parent, "status": "current",
                                "version": {"number": p.version, "createdAt": p.when.isoformat()}}
        if request.query.get("body-format") == "storage":
            item["body"] = {"storage": {"value": p.body, "representation": "storage"}}
        return _json(item)

    async def _spaces_v2(self, request: web.Request) -> web.Response:
        keys = [k for k in request.query.get("keys", "").split(",") if k]
        found = sorted({p.space for p in self.pages.values() if p.space in keys})
        return _json({"results": [{"id": _space_id(k), "key": k, "name": k, "type": "global",
                                   "status": "current", "_links": {"webui": f"/spaces/{k}"}} for k in found],
                      "_links": {"base": self.url}})

    async def _contents_v2(self, request: web.Request) -> web.Response:
        """REST v2 ``GET /pages`` and ``/blogposts``: ``id`` (comma-separated or repeated, at most 250),
        ``space-id``, ``body-format=storage``, ``limit`` and an opaque ``cursor`` in ``_links.next``."""
        kind = "blogpost" if request.path.endswith("/blogposts") else "page"
        ids = [i for v in request.query.getall("id", []) for i in v.split(",") if i]
        if len(ids) > 250:
            return _json(
                {"errors": [{"status": 400, "title": "BAD_REQUEST", "detail": "at most 250 ids"}]}, 400
            )
        space_ids = set(request.query.get("space-id", "").split(",")) - {""}
        rows = [p for p in sorted(self.pages.values(), key=lambda p: int(p.id) if p.id.isdigit() else 0)
                if p.kind == kind and p.status == "current" and (not ids or p.id in ids)
                and (not space_ids or _space_id(p.space) in space_ids)]
        start = (
            int(base64.urlsafe_b64decode(request.query["cursor"]).decode())
            if "cursor" in request.query
            else 0
        )
        limit = max(1, min(int(request.query.get("limit", "25")), self.v2_page_cap))
        window = rows[start:start + limit]
        with_body = request.query.get("body-format") == "storage"
        if with_body:
            for p in window:
                if p.id in self._search_fail:  # a crash while rendering a body, as in the v1 search
                    return _json({"errors": [{"status": 500, "title": "INTERNAL_SERVER_ERROR"}]}, 500)
        results = []
        for p in window:
            item: dict[str, Any] = {
                "id": p.id, "status": p.status, "title": p.title, "spaceId": _space_id(p.space),
                "parentId": p.parent, "authorId": "557058:bot",
                "createdAt": BASE_TIME.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
                "version": {"number": p.version, "createdAt": p.when.isoformat(timespec="milliseconds")
                            .replace("+00:00", "Z"), "message": "", "minorEdit": False},
                "_links": {"webui": f"/spaces/{p.space}/pages/{p.id}", "tinyui": f"/x/{p.id}"},
            }
            if with_body:
                item["body"] = {"storage": {"value": p.body, "representation": "storage"}}
            results.append(item)
        links: dict[str, str] = {"base": self.url}
        if start + limit < len(rows):
            cursor = base64.urlsafe_b64encode(str(start + limit).encode()).decode()
            query = {k: v for k, v in request.query.items() if k != "cursor"}
            links["next"] = f"{self.context}/api/v2/{kind}s?" + urlencode({**query, "cursor": cursor})
        return _json({"results": results, "_links": links})

    async def _space(self, request: web.Request) -> web.Response:
        key = request.match_info["key"]
        if not any(p.space == key for p in self.pages.values()):
            return _json({"statusCode": 404, "message": f"No space with key : {key}"}, 404)
        return _json({"id": abs(hash(key)) % 10**6, "key": key, "name": key, "type": "global",
                      "_links": {**self._links(), "webui": f"/spaces/{key}"}})

    async def _content(self, request: web.Request) -> web.Response:
        p = self.pages.get(request.match_info["id"])
        if p is None or p.status != "current":
            return _json({"statusCode": 404, "message": "No content found with id"}, 404)
        return _json(self._render(p, _expand(request.query.get("expand", ""))))

    async def _restrictions(self, request: web.Request) -> web.Response:
        p = self.pages.get(request.match_info["id"])
        if p is None:
            return _json({"statusCode": 404, "message": "No content found with id"}, 404)
        read = {"user": {"results": [{"type": "known", "username": u} for u in p.restricted_users]},
                "group": {"results": [{"type": "group", "name": g} for g in p.restricted_groups]}}
        empty: dict[str, Any] = {"user": {"results": []}, "group": {"results": []}}
        return _json({"read": {"operation": "read", "restrictions": read},
                      "update": {"operation": "update", "restrictions": empty}})

    # ------------------------------------------------------------------ CQL

    def _run_cql(self, cql: str) -> list[FakePage]:
        where, order = _split_order(cql)
        preds = [self._predicate(c) for c in _clauses(where)]
        rows = [p for p in self.pages.values() if p.status == "current" and all(f(p) for f in preds)]
        if order is None:
            rows.sort(key=lambda p: int(p.id) if p.id.isdigit() else p.id)
        else:
            rows.sort(key=lambda p: (p.when, p.id), reverse=order == "desc")
        return rows

    def _predicate(self, clause: list[str]) -> Any:
        if len(clause) < 3:
            raise CQLError(" ".join(clause))
        fld, op, vals = clause[0].lower(), clause[1].lower(), clause[2:]
        if op == "not" and vals and vals[0].lower() == "in":
            op, vals = "not in", vals[1:]
        values = [v for v in vals if v not in ("(", ")", ",")]
        if op in ("in", "not in") and (vals[0] != "(" or vals[-1] != ")"):
            raise CQLError(f"expected a list after {op}")
        if op not in ("in", "not in") and len(values) != 1:
            raise CQLError(" ".join(clause))
        if fld == "lastmodified":
            bound = self._parse_date(values[0])
            ops = {
                ">=": lambda p: p.when >= bound,
                ">": lambda p: p.when > bound,
                "<=": lambda p: p.when <= bound,
                "<": lambda p: p.when < bound,
                "=": lambda p: bound <= p.when < bound + timedelta(minutes=1),
            }
            if op not in ops:
                raise CQLError(f"operator {op} for lastmodified")
            return ops[op]
        getters = {
            "space": lambda p: {p.space},
            "type": lambda p: {p.kind},
            "id": lambda p: {p.id},
            "title": lambda p: {p.title},
            "parent": lambda p: {p.parent} if p.parent else set(),
            "label": lambda p: set(p.labels),
            "ancestor": lambda p: {a.id for a in self._ancestors(p)},
        }
        if fld not in getters:
            raise CQLError(f"unsupported field {fld}")
        get = getters[fld]
        vs = set(values)
        if op in ("=", "in"):
            return lambda p: bool(get(p) & vs)
        if op in ("!=", "not in"):
            return lambda p: not (get(p) & vs)
        raise CQLError(f"operator {op}")

    def _parse_date(self, text: str) -> datetime:
        for fmt in ("%Y-%m-%d %H:%M", "%Y/%m/%d %H:%M", "%Y-%m-%d", "%Y/%m/%d"):
            try:
                return datetime.strptime(text, fmt).replace(tzinfo=self.tz).astimezone(UTC)
            except ValueError:
                continue
        raise CQLError(f"bad date {text!r}")


_TOKEN = re.compile(r'\s*(?:"((?:[^"\\]|\\.)*)"|(>=|<=|!=|=|>|<|\(|\)|,)|([A-Za-z0-9_.~\-]+))')


def _tokens(text: str) -> list[str]:
    out: list[str] = []
    pos = 0
    text = text.strip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m or m.end() == pos:
            raise CQLError(f"unexpected input at {text[pos:pos + 20]!r}")
        if m.group(1) is not None:
            out.append(re.sub(r"\\(.)", r"\1", m.group(1)))
        else:
            out.append(m.group(2) or m.group(3))
        pos = m.end()
        while pos < len(text) and text[pos].isspace():
            pos += 1
    return out


def _split_order(cql: str) -> tuple[list[str], str | None]:
    toks = _tokens(cql)
    low = [t.lower() for t in toks]
    for i in range(len(toks) - 1):
        if low[i] == "order" and low[i + 1] == "by":
            rest = low[i + 2:]
            if (
                not rest
                or rest[0] != "lastmodified"
                or len(rest) > 2
                or (len(rest) == 2 and rest[1] not in ("asc", "desc"))
            ):
                raise CQLError("only 'order by lastmodified [asc|desc]' is supported")
            return toks[:i], (rest[1] if len(rest) == 2 else "asc")
    return toks, None


def _clauses(toks: list[str]) -> list[list[str]]:
    out: list[list[str]] = [[]]
    depth = 0
    for t in toks:
        depth += t == "("
        depth -= t == ")"
        if t.lower() == "or" and depth == 0:
            raise CQLError("'or' is not supported by the fake")
        if t.lower() == "and" and depth == 0:
            out.append([])
        else:
            out[-1].append(t)
    if any(not c for c in out):
        raise CQLError("empty clause")
    return out


def _expand(value: str) -> set[str]:
    parts = {v.strip() for v in value.split(",") if v.strip()}
    # expanding a nested path implies its parents, like Confluence does
    return parts | {".".join(p.split(".")[:i]) for p in parts for i in range(1, p.count(".") + 1)}


def _space_id(key: str) -> str:
    """A stable numeric space id (REST v2 addresses spaces by id)."""
    return str(int(hashlib.sha1(key.encode()).hexdigest()[:8], 16))


def _stamp(when: datetime, tz: timezone) -> str:
    return when.astimezone(tz).isoformat(timespec="milliseconds")


def _json(data: Any, status: int = 200, *, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(
        status=status, text=json.dumps(data), content_type="application/json", headers=headers
    )
