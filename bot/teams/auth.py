"""Who may post activities to evident, and how evident authenticates its replies.

Inbound: every activity carries ``Authorization: Bearer <JWT>`` signed by the Bot Framework (or Entra ID for
a single-tenant bot). ``ActivityAuth`` checks the RS256 signature against the keys the OpenID metadata
names, the issuer, the audience (our app id), expiry with five minutes of clock skew, and that the token
was issued for the activity's ``serviceUrl``. Keys are cached and refetched when an unknown key id shows up.

Outbound: ``AppTokens`` gets an app-only token (OAuth client credentials, scope
``https://api.botframework.com/.default``) and caches it until shortly before it expires.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import httpx
import jwt

from pipeline.errors import AuthError, RemoteError, UnreachableError

log = logging.getLogger("evident.teams")

BOT_FRAMEWORK_ISSUER = "https://api.botframework.com"
CONNECTOR_SCOPE = "https://api.botframework.com/.default"
CLOCK_SKEW_S = 300
KEYS_MIN_REFRESH_S = 300.0


class ActivityAuth:
    def __init__(self, http: httpx.AsyncClient, *, app_id: str, openid_url: str, tenant_id: str | None = None) -> None:
        self.http = http
        self.app_id = app_id
        self.openid_url = openid_url
        self.issuers = {BOT_FRAMEWORK_ISSUER}
        if tenant_id:
            self.issuers |= {f"https://sts.windows.net/{tenant_id}/", f"https://login.microsoftonline.com/{tenant_id}/v2.0"}
        self._keys: dict[str, jwt.PyJWK] = {}
        self._fetched_at = 0.0
        self._lock = asyncio.Lock()

    async def verify(self, authorization: str | None, service_url: str) -> dict[str, Any]:
        """The token's claims; ``AuthError`` (one line, no token in it) when the request is not genuine."""
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not token:
            raise AuthError("no bearer token", service="teams", status=401)
        try:
            kid = jwt.get_unverified_header(token).get("kid")
        except jwt.PyJWTError as exc:
            raise AuthError(f"malformed token: {type(exc).__name__}", service="teams", status=401) from None
        key = await self._key(str(kid or ""))
        try:
            claims: dict[str, Any] = jwt.decode(
                token, key=key.key, algorithms=["RS256"], audience=self.app_id, issuer=sorted(self.issuers),
                leeway=CLOCK_SKEW_S, options={"require": ["exp", "iss", "aud"]},
            )
        except jwt.PyJWTError as exc:
            raise AuthError(f"token rejected: {exc}", service="teams", status=401) from None
        claimed = claims.get("serviceurl") or claims.get("serviceUrl")
        if claimed and claimed.rstrip("/") != service_url.rstrip("/"):
            raise AuthError("token was issued for another serviceUrl", service="teams", status=401)
        return claims

    async def _key(self, kid: str) -> jwt.PyJWK:
        if kid not in self._keys:
            async with self._lock:  # an unknown key id: refetch, at most every KEYS_MIN_REFRESH_S
                stale = time.monotonic() - self._fetched_at >= KEYS_MIN_REFRESH_S
                if kid not in self._keys and (stale or not self._keys):
                    await self._refresh()
        if kid not in self._keys:
            raise AuthError("token signed with an unknown key", service="teams", status=401)
        return self._keys[kid]

    async def _refresh(self) -> None:
        try:
            meta = (await self.http.get(self.openid_url)).raise_for_status().json()
            jwks = (await self.http.get(meta["jwks_uri"])).raise_for_status().json()
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
            raise UnreachableError(f"cannot read the signing keys from {self.openid_url}: {type(exc).__name__}",
                                   service="teams") from None
        if isinstance(meta.get("issuer"), str):
            self.issuers.add(meta["issuer"])
        keys: dict[str, jwt.PyJWK] = {}
        for jwk in jwks.get("keys", []):
            try:
                keys[str(jwk.get("kid", ""))] = jwt.PyJWK(jwk, algorithm="RS256")
            except (jwt.PyJWTError, ValueError, TypeError) as exc:
                log.warning("skipped a signing key: %s", exc)
        self._keys, self._fetched_at = keys, time.monotonic()


class AppTokens:
    """App-only access tokens for the Bot Connector service (client credentials), cached."""

    def __init__(self, http: httpx.AsyncClient, *, app_id: str, password: str, token_url: str) -> None:
        self.http = http
        self.app_id, self._password, self.token_url = app_id, password, token_url
        self._token, self._expires = "", 0.0
        self._lock = asyncio.Lock()

    async def token(self) -> str:
        async with self._lock:
            if not self._token or time.monotonic() > self._expires - 120:
                await self._fetch()
            return self._token

    def invalidate(self) -> None:
        self._token = ""

    async def _fetch(self) -> None:
        data = {"grant_type": "client_credentials", "client_id": self.app_id, "client_secret": self._password,
                "scope": CONNECTOR_SCOPE}
        try:
            resp = await self.http.post(self.token_url, data=data)
        except httpx.HTTPError as exc:
            raise UnreachableError(f"token endpoint {self.token_url}: {type(exc).__name__}", service="teams") from None
        if resp.status_code in (400, 401, 403):
            raise AuthError("TEAMS_APP_ID / TEAMS_APP_PASSWORD rejected by the token endpoint "
                            f"(HTTP {resp.status_code})", service="teams", status=resp.status_code)
        try:
            body = resp.raise_for_status().json()
            self._token = str(body["access_token"])
            self._expires = time.monotonic() + float(body.get("expires_in", 3600))
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
            raise RemoteError(f"token endpoint answered HTTP {resp.status_code}: {type(exc).__name__}",
                              service="teams", status=resp.status_code) from None
