"""A local fake of the Microsoft side of a Teams bot, for offline tests and the load benchmark.

* ``FakeIdentity``: OpenID metadata and a JWKS (a fresh RSA key pair) like login.botframework.com, plus an
  OAuth client-credentials token endpoint like login.microsoftonline.com.
* ``FakeConnector``: the Bot Connector REST API (``/v3/conversations/{id}/activities[/{id}]``) on 127.0.0.1,
  recording every activity evident posts; it can answer 429 + Retry-After.
* ``ActivitySender``: builds activities as Teams sends them and POSTs them signed (RS256, our ``kid``).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import time
from dataclasses import dataclass
from typing import Any

import aiohttp
import jwt
from aiohttp import web
from cryptography.hazmat.primitives.asymmetric import rsa

APP_ID = "11111111-2222-3333-4444-555555555555"
APP_PASSWORD = "teams-test-secret"
TENANT = "tenant-1"
BOT_ID = f"28:{APP_ID}"
ACCESS_TOKEN = "connector-access-token"


class _Server:
    def __init__(self) -> None:
        self.app = web.Application()
        self._runner: web.AppRunner | None = None
        self.url = ""

    async def start(self) -> Any:
        self._runner = web.AppRunner(self.app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"
        return self

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


class FakeIdentity(_Server):
    """The Bot Framework's metadata (its key endorsed for ``msteams``, a second one endorsed only for
    ``webchat``) and the tenant's own Entra ID metadata with a key of its own."""

    ISSUER = "https://api.botframework.com"
    TENANT_ISSUER = f"https://login.microsoftonline.com/{TENANT}/v2.0"

    def __init__(self) -> None:
        super().__init__()
        self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.kid = "test-key-1"
        self.webchat_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.webchat_kid = "webchat-key"
        self.tenant_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.tenant_kid = "tenant-key"
        self.token_requests: list[dict[str, str]] = []
        self.metadata_reads: list[str] = []
        self.app.router.add_get("/openid", self._openid)
        self.app.router.add_get("/jwks", self._jwks)
        self.app.router.add_get("/tenant/openid", self._tenant_openid)
        self.app.router.add_get("/tenant/jwks", self._tenant_jwks)
        self.app.router.add_post("/token", self._token)

    @property
    def openid_url(self) -> str:
        return f"{self.url}/openid"

    @property
    def tenant_openid_url(self) -> str:
        return f"{self.url}/tenant/openid"

    @property
    def token_url(self) -> str:
        return f"{self.url}/token"

    async def _openid(self, _request: web.Request) -> web.Response:
        self.metadata_reads.append("botframework")
        return web.json_response({"issuer": self.ISSUER, "jwks_uri": f"{self.url}/jwks",
                                  "id_token_signing_alg_values_supported": ["RS256"]})

    async def _jwks(self, _request: web.Request) -> web.Response:
        return web.json_response({"keys": [_jwk(self.key, self.kid, ["msteams", "skype"]),
                                           _jwk(self.webchat_key, self.webchat_kid, ["webchat"])]})

    async def _tenant_openid(self, _request: web.Request) -> web.Response:
        self.metadata_reads.append("tenant")
        return web.json_response({"issuer": self.TENANT_ISSUER, "jwks_uri": f"{self.url}/tenant/jwks"})

    async def _tenant_jwks(self, _request: web.Request) -> web.Response:
        return web.json_response({"keys": [_jwk(self.tenant_key, self.tenant_kid, None)]})

    async def _token(self, request: web.Request) -> web.Response:
        form = dict(await request.post())
        self.token_requests.append({k: str(v) for k, v in form.items()})
        if form.get("client_id") != APP_ID or form.get("client_secret") != APP_PASSWORD:
            return web.json_response({"error": "invalid_client"}, status=401)
        return web.json_response({"access_token": ACCESS_TOKEN, "expires_in": 3600, "token_type": "Bearer"})

    def sign(self, service_url: str | None, *, audience: str = APP_ID, issuer: str | None = None,
             expires_in: float = 600, key: rsa.RSAPrivateKey | None = None, kid: str | None = None,
             **claims: Any) -> str:
        """A token; ``service_url=None`` leaves the ``serviceurl`` claim out."""
        now = int(time.time())
        body: dict[str, Any] = {"iss": issuer or self.ISSUER, "aud": audience, "iat": now, "nbf": now,
                                "exp": now + int(expires_in), **claims}
        if service_url is not None:
            body["serviceurl"] = service_url
        return jwt.encode(body, key or self.key, algorithm="RS256", headers={"kid": kid or self.kid})


def _jwk(key: rsa.RSAPrivateKey, kid: str, endorsements: list[str] | None) -> dict[str, Any]:
    jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key()))
    out = {**jwk, "kid": kid, "use": "sig", "alg": "RS256"}
    if endorsements is not None:
        out["endorsements"] = endorsements
    return out


@dataclass
class Posted:
    method: str
    conversation_id: str
    reply_to: str | None
    activity: dict[str, Any]
    id: str
    at: float = 0.0  # time.monotonic() when it arrived


class FakeConnector(_Server):
    def __init__(self) -> None:
        super().__init__()
        self.posted: list[Posted] = []
        self.throttle: int = 0  # answer this many requests with ``throttle_status`` (429) first
        self.throttle_status = 429
        self.retry_after = "0"
        self.attempts: list[float] = []  # time.monotonic() of every authorized request, refused ones too
        self.unauthorized: list[str] = []
        self._ids = itertools.count(1)
        self._changed = asyncio.Event()
        # conversation id -> its members (TeamsChannelAccount: id, aadObjectId, email, userPrincipalName,
        # userRole, tenantId), for the members API
        self.members: dict[str, list[dict[str, Any]]] = {}
        self.refuse_streams = ""  # answer streaming updates 403 ContentStreamNotAllowed with this message
        # accept this many stream updates, then "cancelled by user"
        self.refuse_streams_after: int | None = None
        self.app.router.add_get("/v3/conversations/{cid}/members/{uid}", self._member)
        self.app.router.add_get("/v3/conversations/{cid}/pagedmembers", self._paged_members)
        base = "/v3/conversations/{cid}/activities"
        self.app.router.add_post(base, self._post)
        self.app.router.add_post(base + "/{aid}", self._post)
        self.app.router.add_put(base + "/{aid}", self._put)

    async def _auth(self, request: web.Request) -> web.Response | None:
        if request.headers.get("Authorization") != f"Bearer {ACCESS_TOKEN}":
            self.unauthorized.append(request.path)
            return web.json_response({"error": "unauthorized"}, status=401)
        self.attempts.append(time.monotonic())
        if self.throttle > 0:
            self.throttle -= 1
            return web.json_response({"error": "throttled"}, status=self.throttle_status,
                                     headers={"Retry-After": self.retry_after})
        return None

    async def _member(self, request: web.Request) -> web.Response:
        refused = await self._auth(request)
        if refused is not None:
            return refused
        uid = request.match_info["uid"]
        for m in self.members.get(request.match_info["cid"], []):
            if uid in (m.get("id"), m.get("aadObjectId")):
                return web.json_response(m)
        return web.json_response({"error": {"code": "MemberNotFoundInConversation"}}, status=404)

    async def _paged_members(self, request: web.Request) -> web.Response:
        refused = await self._auth(request)
        if refused is not None:
            return refused
        members = self.members.get(request.match_info["cid"], [])
        start = int(request.query.get("continuationToken") or 0)
        size = int(request.query.get("pageSize") or 100)
        page: dict[str, Any] = {"members": members[start:start + size]}
        if start + size < len(members):
            page["continuationToken"] = str(start + size)
        return web.json_response(page)

    async def _post(self, request: web.Request) -> web.Response:
        refused = await self._auth(request)
        if refused is not None:
            return refused
        body = await request.json()
        info = next((e for e in body.get("entities") or [] if e.get("type") == "streaminfo"), None)
        if info is not None and self.refuse_streams_after is not None:
            self.refuse_streams_after -= 1
            if self.refuse_streams_after < 0:
                return web.json_response({"error": {"code": "ContentStreamNotAllowed",
                                                    "message": "Content stream was cancelled by user."}},
                                         status=403)
        if info is not None and self.refuse_streams:
            return web.json_response({"error": {"code": "ContentStreamNotAllowed",
                                                "message": self.refuse_streams}}, status=403)
        # Teams' streaming protocol: the first update opens a stream; the later ones and the final message
        # are answered with the stream's id (the final message *is* the streamed one)
        new_id = str(info.get("streamId")) if info is not None and info.get("streamId") else (
            f"bot-msg-{next(self._ids)}")
        self.posted.append(Posted("POST", request.match_info["cid"], request.match_info.get("aid"),
                                  body, new_id, time.monotonic()))
        self._changed.set()
        return web.json_response({"id": new_id}, status=201 if info is not None and not info.get("streamId")
                                 else 200)

    async def _put(self, request: web.Request) -> web.Response:
        refused = await self._auth(request)
        if refused is not None:
            return refused
        self.posted.append(
            Posted(
                "PUT",
                request.match_info["cid"],
                request.match_info["aid"],
                await request.json(),
                request.match_info["aid"],
            )
        )
        self._changed.set()
        return web.json_response({"id": request.match_info["aid"]})

    def messages(self, conversation_id: str | None = None) -> list[Posted]:
        return [p for p in self.posted if p.activity.get("type") == "message"
                and (conversation_id is None or p.conversation_id == conversation_id)]

    async def wait_for(self, predicate: Any, within_s: float = 10.0) -> bool:
        deadline = asyncio.get_running_loop().time() + within_s
        while not predicate():
            remaining = deadline - asyncio.get_running_loop().time()
            if remaining <= 0:
                return False
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), min(remaining, 0.2))
        return True


class ActivitySender:
    """Activities as Teams sends them, POSTed to evident's endpoint with a Bot Framework signature."""

    def __init__(self, endpoint: str, identity: FakeIdentity, service_url: str) -> None:
        self.endpoint = endpoint
        self.identity = identity
        self.service_url = service_url
        self._ids = itertools.count(1)
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> ActivitySender:
        self._session = aiohttp.ClientSession()
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            await self._session.close()

    def _base(
        self, kind: str, conversation: dict[str, Any], *, user: str = "aad-user-1", **extra: Any
    ) -> dict[str, Any]:
        return {"type": kind, "id": f"act-{next(self._ids)}", "timestamp": "2026-11-23T08:00:00Z",
                "serviceUrl": self.service_url, "channelId": "msteams",
                "from": {"id": f"29:{user}", "aadObjectId": user, "name": "Ann"},
                "recipient": {"id": BOT_ID, "name": "evident"}, "conversation": conversation, **extra}

    def channel_mention(self, text: str, *, channel: str = "19:eng@thread.tacv2", root: str | None = None,
                        **extra: Any) -> dict[str, Any]:
        act = self._base(
            "message",
            {},
            text=f"<at>evident</at> {text}",
            entities=[
                {
                    "type": "mention",
                    "text": "<at>evident</at>",
                    "mentioned": {"id": BOT_ID, "name": "evident"},
                }
            ],
            channelData={"channel": {"id": channel}, "team": {"id": "19:team"}, "tenant": {"id": TENANT}},
            **extra,
        )
        act["conversation"] = {
            "id": f"{channel};messageid={root or act['id']}",
            "conversationType": "channel",
            "tenantId": TENANT,
            "isGroup": True,
        }
        return act

    def channel_reply(
        self, text: str, *, channel: str = "19:eng@thread.tacv2", root: str, **extra: Any
    ) -> dict[str, Any]:
        return self._base("message", {"id": f"{channel};messageid={root}", "conversationType": "channel",
                                      "tenantId": TENANT}, text=text,
                          channelData={"channel": {"id": channel}, "tenant": {"id": TENANT}}, **extra)

    def personal(
        self, text: str, *, chat: str = "a:personal-chat-1", user: str = "aad-user-1"
    ) -> dict[str, Any]:
        return self._base("message", {"id": chat, "conversationType": "personal", "tenantId": TENANT},
                          user=user, text=text, channelData={"tenant": {"id": TENANT}})

    def group_chat(self, text: str, *, chat: str = "19:group-chat-1@thread.v2", mention: bool = False,
                   user: str = "aad-user-1") -> dict[str, Any]:
        extra: dict[str, Any] = {}
        if mention:
            text = f"<at>evident</at> {text}"
            extra["entities"] = [{"type": "mention", "text": "<at>evident</at>",
                                  "mentioned": {"id": BOT_ID, "name": "evident"}}]
        return self._base("message", {"id": chat, "conversationType": "groupChat", "tenantId": TENANT,
                                      "isGroup": True}, user=user, text=text,
                          channelData={"tenant": {"id": TENANT}}, **extra)

    def reaction(self, conversation_id: str, reply_to: str, kind: str = "surprised") -> dict[str, Any]:
        return self._base("messageReaction", {"id": conversation_id, "tenantId": TENANT}, replyToId=reply_to,
                          reactionsAdded=[{"type": kind}])

    def explain_button(self, conversation_id: str, reply_to: str, turn: Any) -> dict[str, Any]:
        return self._base("message", {"id": conversation_id, "tenantId": TENANT}, replyToId=reply_to,
                          value={"action": "evident.explain", "turn": turn})

    def feedback(
        self, conversation_id: str, reply_to: str, reaction: str, text: str | None = None
    ) -> dict[str, Any]:
        action: dict[str, Any] = {"reaction": reaction}
        if text is not None:
            action["feedback"] = json.dumps({"feedbackText": text})
        return self._base("invoke", {"id": conversation_id, "tenantId": TENANT}, name="message/submitAction",
                          replyToId=reply_to, value={"actionName": "feedback", "actionValue": action})

    async def send(self, activity: dict[str, Any], *, token: str | None = None,
                   authorization: str | None = None) -> tuple[int, Any]:
        assert self._session is not None
        auth = authorization if authorization is not None else \
            f"Bearer {token or self.identity.sign(activity['serviceUrl'])}"
        headers = {"Authorization": auth} if auth else {}
        async with self._session.post(self.endpoint, json=activity, headers=headers) as resp:
            body = await resp.text()
            return resp.status, (json.loads(body) if body else None)
