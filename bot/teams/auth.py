"""Who may post activities to evident, and how evident authenticates its replies.

Inbound: every activity carries ``Authorization: Bearer <JWT>``. ``ActivityAuth`` accepts it only when all of
these hold (the Bot Framework's connector authentication rules, as the SDKs apply them):

- it is RS256-signed by a key of **its issuer's** OpenID metadata: Bot Framework channel tokens
  (``https://api.botframework.com``) by ``EVIDENT_TEAMS_OPENID_URL``'s keys; Entra ID tokens of a
  single-tenant bot's tenant (``https://sts.windows.net/<tenant>/``,
  ``https://login.microsoftonline.com/<tenant>/v2.0``) by the tenant's own metadata, and their ``tid`` names
  that tenant. A key of one issuer never validates another's token;
- the audience is our app id, ``exp``/``nbf`` hold with five minutes of clock skew;
- the signing key's **endorsements**, where it has any, include the activity's ``channelId`` (a key endorsed
  only for another channel is refused; an activity without a channel id is refused by an endorsed key);
- the token carries a ``serviceurl`` claim equal to the activity's ``serviceUrl``. A token without the claim
  is refused: replies go to ``serviceUrl`` with evident's own Connector token, so only a token that names
  that host may send evident there.

Key sets are cached per issuer, refetched after a day, and at most every five minutes when an unknown key id
shows up.

Outbound: ``AppTokens`` gets an app-only token (OAuth client credentials, scope
``https://api.botframework.com/.default``) and caches it until shortly before it expires.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
import jwt

from pipeline.errors import AuthError, RemoteError, UnreachableError

log = logging.getLogger("evident.teams")

BOT_FRAMEWORK_ISSUER = "https://api.botframework.com"
CONNECTOR_SCOPE = "https://api.botframework.com/.default"
CLOCK_SKEW_S = 300
KEYS_MIN_REFRESH_S = 300.0
KEYS_MAX_AGE_S = 24 * 3600.0


def tenant_openid_url(tenant_id: str) -> str:
    """The OpenID metadata of a tenant's Entra ID v2.0 tokens (its keys sign the tenant's tokens)."""
    return f"https://login.microsoftonline.com/{tenant_id}/v2.0/.well-known/openid-configuration"


def tenant_issuers(tenant_id: str) -> tuple[str, str]:
    return f"https://sts.windows.net/{tenant_id}/", f"https://login.microsoftonline.com/{tenant_id}/v2.0"


@dataclass
class _KeySet:
    """The signing keys one OpenID metadata document names, with each key's endorsements."""

    openid_url: str
    keys: dict[str, jwt.PyJWK] = field(default_factory=dict)
    endorsements: dict[str, frozenset[str]] = field(default_factory=dict)
    fetched_at: float = 0.0
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class ActivityAuth:
    def __init__(self, http: httpx.AsyncClient, *, app_id: str, openid_url: str, tenant_id: str | None = None,
                 tenant_openid: str | None = None) -> None:
        self.http = http
        self.app_id = app_id
        self.tenant_id = tenant_id
        self._sources: dict[str, _KeySet] = {BOT_FRAMEWORK_ISSUER: _KeySet(openid_url)}
        if tenant_id:
            tenant_keys = _KeySet(tenant_openid or tenant_openid_url(tenant_id))
            for issuer in tenant_issuers(tenant_id):
                self._sources[issuer] = tenant_keys

    async def verify(
        self, authorization: str | None, service_url: str, channel_id: str = ""
    ) -> dict[str, Any]:
        """The token's claims; ``AuthError`` (one line, no token in it) when the request is not genuine."""
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not token:
            raise AuthError("no bearer token", service="teams", status=401)
        try:
            kid = str(jwt.get_unverified_header(token).get("kid") or "")
            issuer = str(jwt.decode(token, options={"verify_signature": False}).get("iss") or "")
        except jwt.PyJWTError as exc:
            raise AuthError(f"malformed token: {type(exc).__name__}", service="teams", status=401) from None
        source = self._sources.get(issuer)
        if source is None:
            raise AuthError("token from an issuer evident does not trust", service="teams", status=401)
        key = await self._key(source, kid)
        try:
            claims: dict[str, Any] = jwt.decode(
                token, key=key.key, algorithms=["RS256"], audience=self.app_id, issuer=issuer,
                leeway=CLOCK_SKEW_S, options={"require": ["exp", "iss", "aud"]},
            )
        except jwt.PyJWTError as exc:
            raise AuthError(f"token rejected: {exc}", service="teams", status=401) from None
        _check_endorsement(source.endorsements.get(kid), channel_id)
        if (
            issuer != BOT_FRAMEWORK_ISSUER
            and self.tenant_id
            and claims.get("tid") not in (None, self.tenant_id)
        ):
            raise AuthError("token of another tenant", service="teams", status=401)
        claimed = claims.get("serviceurl") or claims.get("serviceUrl")
        if not isinstance(claimed, str) or not claimed:
            raise AuthError("token carries no serviceurl claim", service="teams", status=401)
        if claimed.rstrip("/") != service_url.rstrip("/"):
            raise AuthError("token was issued for another serviceUrl", service="teams", status=401)
        return claims

    async def _key(self, source: _KeySet, kid: str) -> jwt.PyJWK:
        now = time.monotonic()
        if kid not in source.keys or now - source.fetched_at >= KEYS_MAX_AGE_S:
            async with source.lock:  # an unknown key id: refetch, at most every KEYS_MIN_REFRESH_S
                age = time.monotonic() - source.fetched_at
                unknown = kid not in source.keys and (age >= KEYS_MIN_REFRESH_S or not source.keys)
                if unknown or age >= KEYS_MAX_AGE_S:
                    await self._refresh(source)
        if kid not in source.keys:
            raise AuthError("token signed with an unknown key", service="teams", status=401)
        return source.keys[kid]

    async def _refresh(self, source: _KeySet) -> None:
        try:
            meta = (await self.http.get(source.openid_url)).raise_for_status().json()
            jwks = (await self.http.get(meta["jwks_uri"])).raise_for_status().json()
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
            raise UnreachableError(
                f"cannot read the signing keys from {source.openid_url}: {type(exc).__name__}",
                service="teams",
            ) from None
        keys: dict[str, jwt.PyJWK] = {}
        endorsements: dict[str, frozenset[str]] = {}
        for jwk in jwks.get("keys", []) if isinstance(jwks, dict) else []:
            try:
                kid = str(jwk.get("kid", ""))
                keys[kid] = jwt.PyJWK(jwk, algorithm="RS256")
            except (jwt.PyJWTError, ValueError, TypeError, AttributeError) as exc:
                log.warning("skipped a signing key: %s", exc)
                continue
            endorsed = jwk.get("endorsements")
            if isinstance(endorsed, list) and endorsed:
                endorsements[kid] = frozenset(str(e).lower() for e in endorsed)
        source.keys, source.endorsements, source.fetched_at = keys, endorsements, time.monotonic()


def _check_endorsement(endorsed: frozenset[str] | None, channel_id: str) -> None:
    """A key endorsed for some channels signs only activities of those channels."""
    if endorsed is None:
        return
    if not channel_id or channel_id.lower() not in endorsed:
        raise AuthError(
            f"signing key is not endorsed for channel {channel_id or '(none)'!r}", service="teams", status=401
        )


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
            raise UnreachableError(
                f"token endpoint {self.token_url}: {type(exc).__name__}", service="teams"
            ) from None
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
