"""The Bot Connector REST API (``{serviceUrl}/v3/conversations/...``): send, reply, update, typing, members.

429 and 5xx are retried through the shared remote-call helper (``pipeline.runtime.remote``: ``Retry-After``
honoured on both); a 401 refreshes the app token once. Errors are ``pipeline.errors.RemoteError`` subclasses
naming the status.
"""

from __future__ import annotations

import logging
from typing import Any
from urllib.parse import quote

import httpx

from bot.teams.auth import AppTokens
from pipeline.errors import UnreachableError
from pipeline.runtime.remote import CallOptions, RetryPolicy, call_with_retries, status_error

log = logging.getLogger("evident.teams")


class ConnectorClient:
    def __init__(self, http: httpx.AsyncClient, tokens: AppTokens, *, max_retries: int = 4,
                 backoff_s: float = 0.5, max_wait_s: float = 30.0) -> None:
        self.http = http
        self.tokens = tokens
        self.policy = RetryPolicy(max_retries=max_retries, initial_s=backoff_s, max_s=max_wait_s,
                                  retry_after_cap_s=max_wait_s)

    async def send(self, service_url: str, conversation_id: str, activity: dict[str, Any],
                   reply_to: str | None = None) -> str:
        """Post ``activity`` into the conversation (as a reply to ``reply_to`` where given); its new id."""
        path = f"v3/conversations/{quote(conversation_id, safe='')}/activities"
        if reply_to:
            path += f"/{quote(reply_to, safe='')}"
        body = await self._call("POST", service_url, path, activity)
        return str(body.get("id") or "")

    async def update(self, service_url: str, conversation_id: str, activity_id: str,
                     activity: dict[str, Any]) -> None:
        path = f"v3/conversations/{quote(conversation_id, safe='')}/activities/{quote(activity_id, safe='')}"
        await self._call("PUT", service_url, path, {**activity, "id": activity_id})

    async def get(self, service_url: str, path: str) -> dict[str, Any]:
        """A read (e.g. ``v3/conversations/{id}/members/{user}``): its JSON object."""
        return await self._call("GET", service_url, path, None)

    async def _call(
        self, method: str, service_url: str, path: str, payload: dict[str, Any] | None
    ) -> dict[str, Any]:
        url = service_url.rstrip("/") + "/" + path
        return await call_with_retries(lambda: self._once(method, url, payload), self.policy,
                                       CallOptions(log, f"teams {method}"))

    async def _once(
        self, method: str, url: str, payload: dict[str, Any] | None, *, fresh: bool = False
    ) -> dict[str, Any]:
        headers = {"Authorization": f"Bearer {await self.tokens.token()}"}
        try:
            resp = await self.http.request(method, url, json=payload, headers=headers)
        except httpx.HTTPError as exc:
            raise UnreachableError(f"Bot Connector {url}: {type(exc).__name__}", service="teams") from None
        if resp.status_code == 401 and not fresh:
            self.tokens.invalidate()
            return await self._once(method, url, payload, fresh=True)
        if resp.status_code >= 400:
            raise status_error(resp.status_code, service="teams", what=f"Bot Connector answered{_why(resp)}",
                               headers=resp.headers)
        try:
            body = resp.json() if resp.content else {}
        except ValueError:
            body = {}
        return body if isinstance(body, dict) else {}


def _why(resp: httpx.Response) -> str:
    """The connector's own error code and message (e.g. ``ContentStreamNotAllowed: Content stream was
    cancelled
    by user``), short, where the body carries them."""
    try:
        error = resp.json().get("error") or {}
    except (ValueError, AttributeError):
        return ""
    if not isinstance(error, dict):
        return ""
    code, message = str(error.get("code") or ""), str(error.get("message") or "")
    return f" {code}: {message}"[:200] if code or message else ""
