"""Confluence's HTTP answers as JSON or as ``pipeline.errors`` exceptions (the mapping every request of
``connectors.confluence.client`` goes through)."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import requests

from pipeline.errors import (
    AuthError,
    NotFoundError,
    RateLimitedError,
    RemoteError,
    TransientError,
    UnreachableError,
)
from pipeline.runtime.remote import retry_after_s

SERVICE = "confluence"
WIKI_HINT = "Confluence Cloud site URLs end in /wiki, e.g. https://your-site.atlassian.net/wiki"


def decode(resp: requests.Response, path: str, base_url: str) -> dict[str, Any]:
    """Map an HTTP response to its JSON or to an ``pipeline.errors`` exception."""
    status = resp.status_code
    where = short(path)
    if 200 <= status < 300:
        return _json_of(resp, where, base_url)
    message = _message(resp)
    if status == 429 or (status == 403 and _throttled(resp)):
        raise RateLimitedError(
            f"Confluence rate limit on {where} (HTTP {status})", service=SERVICE, status=status,
            retry_after_s=retry_after_s(resp.headers),
        )
    if status == 401:
        raise AuthError(
            "Confluence rejected the credentials (HTTP 401): check "
            f"CONFLUENCE_USER/CONFLUENCE_TOKEN{message}",
            service=SERVICE,
            status=status,
        )
    if status == 403:
        raise AuthError(
            f"Confluence denied access to {where} (HTTP 403){message}", service=SERVICE, status=status
        )
    if status == 404:
        if not _is_json(resp):
            raise UnreachableError(
                f"{base_url} has no Confluence REST API (HTTP 404 on {where}). {WIKI_HINT}",
                service=SERVICE, status=status,
            )
        raise NotFoundError(
            f"Confluence: {where} not found (HTTP 404){message}", service=SERVICE, status=status
        )
    if status >= 500 or status in (408, 502, 503, 504):
        raise TransientError(
            f"Confluence server error on {where} (HTTP {status})",
            service=SERVICE,
            status=status,
            retry_after_s=retry_after_s(resp.headers),
        )
    raise RemoteError(f"Confluence refused {where} (HTTP {status}){message}", service=SERVICE, status=status)


def _json_of(resp: requests.Response, where: str, base_url: str) -> dict[str, Any]:
    status = resp.status_code
    try:
        data = resp.json()
    except ValueError as exc:
        raise UnreachableError(
            f"{base_url} answered {where} with non-JSON (is it the Confluence base URL?). {WIKI_HINT}",
            service=SERVICE, status=status,
        ) from exc
    if isinstance(data, list):  # e.g. Data Center's space permissions: a bare array
        return {"results": data}
    if not isinstance(data, dict):
        raise RemoteError(f"unexpected JSON from Confluence {where}", service=SERVICE, status=status)
    return data


def _throttled(resp: requests.Response) -> bool:
    """Data Center signals rate limiting as 403 with rate-limit headers (or 429)."""
    h = resp.headers
    return "Retry-After" in h or h.get("X-RateLimit-Remaining", "").strip() == "0"


def _is_json(resp: requests.Response) -> bool:
    if "json" in resp.headers.get("Content-Type", ""):
        return True
    try:
        resp.json()
    except ValueError:
        return False
    return True


def _message(resp: requests.Response) -> str:
    try:
        data = resp.json()
    except ValueError:
        return ""
    if isinstance(data, dict) and data.get("message"):
        return f": {str(data['message'])[:200]}"
    return ""


def short(path: str) -> str:
    return urlsplit(path).path or path


def reason(exc: BaseException) -> str:
    text = str(exc)
    for marker in ("Connection refused", "Name or service not known", "nodename nor servname",
                   "Temporary failure in name resolution", "timed out"):
        if marker in text:
            return marker
    return type(exc).__name__
