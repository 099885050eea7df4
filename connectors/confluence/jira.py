"""Issue summaries for Jira macros, when a Jira site is configured (``JIRA_URL``, ``JIRA_USER``,
``JIRA_TOKEN``).

A ``jira`` macro naming one issue shows "KEY: summary" to a reader; storage format holds only the key. With a
Jira site configured, the keys of one page are looked up in one JQL search (``key in (…)``; Cloud's
``/rest/api/3/search/jql``, Data Center's ``/rest/api/2/search``) and the macro becomes "KEY: summary".
Only keys are resolved, never a macro's own JQL query: page text must not choose what the bot account
searches for. Keys that do not look like issue keys are left alone (no JQL injection). Without a Jira site,
or when Jira fails, the parser keeps the bare key.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from typing import Any

import httpx

from pipeline.errors import TransientError, UnreachableError
from pipeline.runtime.remote import CallOptions, RetryPolicy, call_with_retries, status_error

log = logging.getLogger(__name__)

ISSUE_KEY = re.compile(r"^[A-Z][A-Z0-9_]{0,30}-\d{1,9}$")
MAX_KEYS = 100


class JiraClient:
    """One JQL search endpoint of a Jira site (Cloud: e-mail + API token; Data Center: a personal token)."""

    def __init__(self, url: str, *, token: str, user: str | None = None, timeout_s: float = 30.0,
                 max_retries: int = 3) -> None:
        self.url = url.rstrip("/")
        self.cloud = user is not None
        self._auth = httpx.BasicAuth(user, token) if user is not None else None
        self._headers = {} if user is not None else {"Authorization": f"Bearer {token}"}
        self._timeout_s = timeout_s
        self.max_retries = max_retries
        self.api_calls = 0

    async def summaries(self, keys: Sequence[str]) -> dict[str, str]:
        """key -> summary for those of ``keys`` that are issues the account can see."""
        wanted = sorted({k for k in keys if ISSUE_KEY.match(k)})[:MAX_KEYS]
        if not wanted:
            return {}
        path = "/rest/api/3/search/jql" if self.cloud else "/rest/api/2/search"
        params = {"jql": f"key in ({', '.join(wanted)})", "fields": "summary", "maxResults": str(len(wanted)),
                  "validateQuery": "warn"}  # a key of a missing project must not fail the others
        async with httpx.AsyncClient(timeout=self._timeout_s, auth=self._auth, headers=self._headers) as http:
            data = await call_with_retries(lambda: self._get(http, path, params),
                                           RetryPolicy(max_retries=self.max_retries),
                                           CallOptions(log, "jira search", level=logging.INFO))
        issues = data.get("issues")
        return {str(i["key"]): str((i.get("fields") or {}).get("summary") or "")
                for i in (issues if isinstance(issues, list) else []) if isinstance(i, dict) and i.get("key")}

    async def _get(self, http: httpx.AsyncClient, path: str, params: dict[str, str]) -> dict[str, Any]:
        self.api_calls += 1
        try:
            resp = await http.get(self.url + path, params=params)
        except httpx.TimeoutException as exc:
            raise TransientError("Jira timed out", service="jira") from exc
        except httpx.HTTPError as exc:
            raise UnreachableError(
                f"cannot reach Jira at JIRA_URL ({type(exc).__name__})", service="jira"
            ) from exc
        if resp.status_code == 400:  # a key of a project that does not exist: JQL refuses the whole query
            return {"issues": []}
        if resp.status_code >= 300:
            raise status_error(
                resp.status_code,
                service="jira",
                what="Jira search answered",
                headers=resp.headers,
                auth_hint="JIRA_USER / JIRA_TOKEN",
            )
        try:
            body = resp.json()
        except ValueError as exc:
            raise UnreachableError("Jira answered with non-JSON (is JIRA_URL the site's base URL?)",
                                   service="jira") from exc
        return body if isinstance(body, dict) else {}
