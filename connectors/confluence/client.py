"""Async wrapper over atlassian-python-api's ``Confluence`` client with our own retries and error mapping.

The library client is synchronous, so every call and the decoding of its JSON run in a worker thread
(``asyncio.to_thread``) and the event loop never blocks. We use the library for what it does well (auth for
Cloud and Data Center, session, URL joining) but call the REST paths explicitly through its ``get``: on Cloud
the space check and page and blog post bodies go through REST v2 (``/wiki/api/v2/spaces``, ``/pages``,
``/blogposts``), CQL search stays on v1 (v2 has no CQL, nor ancestor titles, labels or read restrictions in
its lists); otherwise its method set differs between Cloud and Server implementations and releases (5.x routes
legacy Cloud methods to the v2 API root and Server ``cql()`` to ``/rest/api/search``), while
``/rest/api/content/search``, ``/rest/api/space/{key}`` and ``/rest/api/content/{id}`` exist on both Cloud
(under ``/wiki``) and Data Center. The library's own retry loops are switched off so that retries, waits and
the API-call count are ours.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any
from urllib.parse import urlsplit

import requests
from atlassian import Confluence

from connectors.confluence.responses import SERVICE, decode, reason, short
from pipeline.errors import (
    InputError,
    NotFoundError,
    TransientError,
    UnreachableError,
)
from pipeline.runtime.remote import CallOptions, RetryPolicy, call_with_retries, retryable

log = logging.getLogger(__name__)

V2_MAX_IDS = 250  # REST v2's most ids per request (and its largest ``limit``)


class ConfluenceTimeout(TransientError):
    """A request that took longer than ``CONFLUENCE_TIMEOUT_S``."""


class ConfluenceClient:
    """GETs against Confluence's REST API with retry/backoff, counted in ``api_calls``.

    Retries: 429 (and Data Center's throttling 403 that carries ``Retry-After`` or
    ``X-RateLimit-Remaining: 0``) wait for ``Retry-After`` when given, else back off; 5xx, timeouts and
    connection failures back off exponentially with full jitter. At most ``max_retries`` retries.
    """

    def __init__(
        self,
        url: str,
        *,
        token: str,
        user: str | None = None,
        timeout_s: float = 30.0,
        max_retries: int = 5,
        backoff_base_s: float = 0.5,
        backoff_max_s: float = 30.0,
        max_retry_after_s: float = 300.0,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.url = url.rstrip("/")
        self.cloud = user is not None
        common: dict[str, Any] = {
            "timeout": max(1, round(timeout_s)),
            "backoff_and_retry": False,
            "retry_with_header": False,
        }
        if user is not None:
            self._api = Confluence(self.url, username=user, password=token, cloud=True, **common)
        else:
            self._api = Confluence(self.url, token=token, cloud=False, **common)
        self.max_retries = max_retries
        self.backoff_base_s = backoff_base_s
        self.backoff_max_s = backoff_max_s
        self.max_retry_after_s = max_retry_after_s
        self._sleep = sleep
        self.api_calls = 0
        self.retries = 0
        self.v2_bodies = self.cloud  # Cloud bodies through REST v2 until the site answers 404 there

    # ------------------------------------------------------------------ raw GET with retries

    async def get(self, path: str, params: dict[str, Any] | None = None, *,
                  max_timeouts: int | None = None) -> dict[str, Any]:
        """GET ``path`` (relative to the site URL, e.g. ``rest/api/space/KEY``) and return its JSON.

        Retries 429 and 5xx (waiting ``Retry-After``), timeouts and dropped connections
        (``pipeline.runtime.remote``); an ``UnreachableError`` with a status (a wrong base URL that answers)
        is not retried. ``max_timeouts``: give up (``ConfluenceTimeout``) after that many timeouts, so the
        caller can ask for less.
        """
        timeouts = 0

        def count() -> None:
            self.retries += 1

        def retry(exc: BaseException) -> bool:
            nonlocal timeouts
            if isinstance(exc, ConfluenceTimeout):
                timeouts += 1
                if max_timeouts is not None and timeouts >= max_timeouts:
                    return False
            return retryable(exc)

        policy = RetryPolicy(
            max_retries=self.max_retries,
            initial_s=self.backoff_base_s,
            max_s=self.backoff_max_s,
            retry_after_cap_s=self.max_retry_after_s,
        )
        return await call_with_retries(lambda: self._get_once(path, params), policy,
                                       CallOptions(log, "confluence GET", retry=retry, level=logging.INFO,
                                                   count=count), sleep=self._sleep)

    async def post(self, path: str, payload: dict[str, Any]) -> dict[str, Any]:
        """POST JSON (Data Center's JSON-RPC, for permissions older sites serve no other way), retried like a
        GET: it only reads."""
        policy = RetryPolicy(max_retries=self.max_retries, initial_s=self.backoff_base_s,
                             max_s=self.backoff_max_s, retry_after_cap_s=self.max_retry_after_s)
        return await call_with_retries(lambda: self._get_once(path, None, payload), policy,
                                       CallOptions(log, "confluence POST", level=logging.INFO),
                                       sleep=self._sleep)

    async def _get_once(self, path: str, params: dict[str, Any] | None,
                        payload: dict[str, Any] | None = None) -> dict[str, Any]:
        self.api_calls += 1
        try:
            return await asyncio.to_thread(self._request, path, params, payload)
        except requests.Timeout as exc:
            raise ConfluenceTimeout(f"Confluence timed out on {short(path)} (CONFLUENCE_TIMEOUT_S)",
                                    service=SERVICE) from exc
        except requests.ConnectionError as exc:
            host = urlsplit(self.url).netloc or self.url
            raise UnreachableError(
                f"cannot reach Confluence at {host}: {reason(exc)}", service=SERVICE
            ) from exc
        except requests.RequestException as exc:
            raise UnreachableError(f"Confluence request failed: {exc}", service=SERVICE) from exc

    def _request(self, path: str, params: dict[str, Any] | None, payload: dict[str, Any] | None
                 ) -> dict[str, Any]:
        """One request and its decoded JSON, in a worker thread: a page of 250 bodies or restrictions is
        hundreds of kB of JSON (decoding one on the event loop blocked serve for 127 ms)."""
        absolute = path.startswith(("http://", "https://"))
        if payload is not None:
            resp = self._api.post(path, json=payload, absolute=absolute, advanced_mode=True)
        else:
            resp = self._api.get(path, params=params, absolute=absolute, advanced_mode=True)
        return decode(resp, path, self.url)

    # ------------------------------------------------------------------ endpoints

    async def space(self, key: str) -> dict[str, Any]:
        """The space, or ``NotFoundError`` naming the key when it is absent or invisible to the token.

        Cloud asks REST v2 (``/api/v2/spaces?keys=``; v1's ``/rest/api/space/{key}`` is being retired there),
        Data Center its REST API.
        """
        missing = NotFoundError(
            f"space '{key}' not found or not visible to this token", service=SERVICE, status=404
        )
        if self.cloud:
            data = await self.get("api/v2/spaces", {"keys": key, "limit": 1})
            found = [s for s in data.get("results") or [] if isinstance(s, dict) and s.get("key") == key]
            if not found:
                raise missing
            return found[0]
        try:
            return await self.get(f"rest/api/space/{key}")
        except NotFoundError as exc:
            raise missing from exc

    async def search(
        self, cql: str, *, expand: str | None = None, limit: int = 50
    ) -> AsyncIterator[dict[str, Any]]:
        """Every result of a CQL content search, following ``_links.next`` (or start+limit) paging.

        A results page that times out twice is asked for again with half as many results (bodies make pages
        slow on large sites), down to one; the smaller size is kept for the rest of the search.
        """
        params: dict[str, Any] = {"cql": cql, "start": 0, "limit": limit}
        if expand:
            params["expand"] = expand
        path: str = "rest/api/content/search"
        query: dict[str, Any] | None = params
        start = 0
        while True:
            try:
                data = await self.get(path, query, max_timeouts=2)
            except ConfluenceTimeout:
                if int(params["limit"]) <= 1:
                    raise
                params = {**params, "start": start, "limit": int(params["limit"]) // 2}
                log.warning(
                    "Confluence search timed out twice at result %d; asking for %d results per request",
                    start,
                    params["limit"],
                )
                path, query = "rest/api/content/search", params
                continue
            results = data.get("results") or []
            for item in results:
                yield item
            start += len(results)
            nxt = (data.get("_links") or {}).get("next")
            if nxt:
                path, query = self._next_path(str(nxt), data), None
            elif results and int(data.get("start", 0)) + len(results) < int(data.get("totalSize", 0)):
                params = {**params, "start": int(data.get("start", 0)) + len(results)}
                path, query = "rest/api/content/search", params
            else:
                return

    async def storage_bodies(self, kind: str, ids: Sequence[str]) -> dict[str, str]:
        """Cloud: the storage-format bodies of the pages (``kind="page"``) or blog posts (``"blogpost"``)
        ``ids`` through REST v2, at most 250 per request (``/api/v2/pages?id=1,2&body-format=storage``),
        following the cursor in ``_links.next``. A site without those endpoints (HTTP 404) is read through v1
        search for the rest of the run. Ids the site does not return (deleted meanwhile) are absent from the
        answer."""
        out: dict[str, str] = {}
        wanted = [i for i in dict.fromkeys(ids) if i.isdigit()]
        for n in range(0, len(wanted), V2_MAX_IDS):
            chunk = wanted[n:n + V2_MAX_IDS]
            if self.v2_bodies:
                try:
                    out |= await self._v2_bodies(kind, chunk)
                    continue
                except (NotFoundError, UnreachableError) as exc:
                    if exc.status != 404:
                        raise
                    log.warning("Confluence has no REST v2 %ss endpoint (HTTP 404): reading bodies through "
                                "v1 search for the rest of this run", kind)
                    self.v2_bodies = False
            rows = self.search(f"id in ({', '.join(chunk)})", expand="body.storage", limit=50)
            out |= {str(r.get("id")): b async for r in rows if (b := storage_of(r)) is not None}
        return out

    async def _v2_bodies(self, kind: str, chunk: Sequence[str]) -> dict[str, str]:
        out: dict[str, str] = {}
        path: str = {"page": "api/v2/pages", "blogpost": "api/v2/blogposts"}[kind]
        query: dict[str, Any] | None = {"id": ",".join(chunk), "body-format": "storage", "limit": len(chunk)}
        while True:
            data = await self.get(path, query)
            out |= {
                str(r.get("id")): b for r in data.get("results") or [] if (b := storage_of(r)) is not None
            }
            nxt = (data.get("_links") or {}).get("next")
            if not nxt:
                return out
            path, query = self._next_path(str(nxt), data), None

    async def comment_body(self, comment_id: str) -> str:
        """Cloud: a comment's storage body through REST v2 (footer comments, else inline ones)."""
        try:
            data = await self.get(f"api/v2/footer-comments/{comment_id}", {"body-format": "storage"})
        except NotFoundError:
            data = await self.get(f"api/v2/inline-comments/{comment_id}", {"body-format": "storage"})
        return storage_of(data) or ""

    async def download(self, path: str, *, max_bytes: int) -> bytes:
        """The bytes behind a ``_links.download`` path (relative to the site URL), at most ``max_bytes``."""
        self.api_calls += 1
        url = self._next_path(path, {})

        def fetch() -> bytes:
            with self._api.session.get(url, stream=True, timeout=self._api.timeout) as resp:
                if resp.status_code >= 400:
                    decode(resp, path, self.url)  # raises the mapped error
                chunks, size = [], 0
                for chunk in resp.iter_content(65536):
                    size += len(chunk)
                    if size > max_bytes:
                        raise InputError(f"attachment is larger than {max_bytes} bytes")
                    chunks.append(chunk)
                return b"".join(chunks)

        try:
            return await asyncio.to_thread(fetch)
        except requests.Timeout as exc:
            raise ConfluenceTimeout(f"Confluence timed out on {short(path)}", service=SERVICE) from exc
        except requests.RequestException as exc:
            raise UnreachableError(f"Confluence download failed: {reason(exc)}", service=SERVICE) from exc

    def _next_path(self, nxt: str, data: dict[str, Any]) -> str:
        """Resolve ``_links.next`` against *our* site URL (``_links.base`` may be a proxy's public name)."""
        if nxt.startswith(("http://", "https://")):
            return nxt
        context = str((data.get("_links") or {}).get("context") or "").rstrip("/")
        if not context:  # REST v2 links carry the site's path (``/wiki/api/v2/...``) and no context
            context = urlsplit(self.url).path.rstrip("/")
        if context and nxt.startswith(context + "/") and self.url.endswith(context):
            nxt = nxt[len(context):]
        return self.url + "/" + nxt.lstrip("/")

    def close(self) -> None:
        self._api.close()


# ---------------------------------------------------------------------- response mapping


def storage_of(item: Any) -> str | None:
    """The storage-format body of a content object (v1 ``expand=body.storage`` or v2
    ``body-format=storage``)."""
    body = (((item.get("body") or {}).get("storage")) or {}).get("value") if isinstance(item, dict) else None
    return body if isinstance(body, str) else None
