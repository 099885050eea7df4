"""The Teams messaging endpoint (``POST /api/messages``) as a ``bot.core.platform.Platform``.

Each request is authenticated (``bot.teams.auth``), parsed, handed to ``TeamsBot`` and answered at once:
200 for activities (the answer follows through the Bot Connector), the invoke response for invokes, 401 for a
request that is not from the Bot Framework, 400 for a body that is not an activity, 503 while shutting down.
The endpoint listens on ``EVIDENT_TEAMS_PORT``; health and metrics stay on the shared ``EVIDENT_HTTP_PORT``.
"""

from __future__ import annotations

import contextlib
import json
import logging

import httpx
from aiohttp import web

from bot.core.access import AccessPolicy
from bot.core.contracts import EngineLike
from bot.core.settings import ChatSettings
from bot.teams.activity import Activity
from bot.teams.auth import ActivityAuth, AppTokens
from bot.teams.connector import ConnectorClient
from bot.teams.handlers import TeamsBot
from bot.teams.settings import TeamsSettings
from pipeline.errors import AuthError, ConfigError, UnreachableError
from pipeline.runtime.metrics import Metrics

log = logging.getLogger("evident.teams")

MESSAGES_PATH = "/api/messages"
MAX_BODY_BYTES = 1_000_000


def check_teams_settings(teams: TeamsSettings) -> None:
    if not teams.app_id:
        raise ConfigError("TEAMS_APP_ID missing: the Azure Bot's Microsoft App ID")
    if not teams.app_password.get_secret_value():
        raise ConfigError("TEAMS_APP_PASSWORD missing: a client secret of the bot's app registration")
    if not (teams.tenant_id or teams.token_url):
        raise ConfigError("TEAMS_TENANT_ID missing: the tenant of the (single-tenant) bot registration")


def token_url(teams: TeamsSettings) -> str:
    return teams.token_url or f"https://login.microsoftonline.com/{teams.tenant_id}/oauth2/v2.0/token"


def build_teams(teams: TeamsSettings, chat: ChatSettings, engine: EngineLike, policy: AccessPolicy,
                http: httpx.AsyncClient) -> tuple[TeamsBot, ActivityAuth]:
    check_teams_settings(teams)
    assert teams.app_id is not None and teams.openid_url is not None
    tokens = AppTokens(http, app_id=teams.app_id, password=teams.app_password.get_secret_value(),
                       token_url=token_url(teams))
    auth = ActivityAuth(http, app_id=teams.app_id, openid_url=teams.openid_url, tenant_id=teams.tenant_id,
                        tenant_openid=teams.tenant_openid_url)
    return TeamsBot(teams, chat, engine, ConnectorClient(http, tokens), policy), auth


def build_web_app(bot: TeamsBot, auth: ActivityAuth, *, metrics: Metrics | None = None) -> web.Application:
    async def messages(request: web.Request) -> web.Response:
        if (request.content_length or 0) > MAX_BODY_BYTES:
            return web.json_response({"error": "activity too large"}, status=413)
        try:
            body = json.loads(await request.read())
        except ValueError:
            return web.json_response({"error": "not JSON"}, status=400)
        if not isinstance(body, dict) or not isinstance(body.get("type"), str):
            return web.json_response({"error": "not an activity"}, status=400)
        activity = Activity.parse(body)
        try:
            await auth.verify(
                request.headers.get("Authorization"), activity.service_url, activity.bot_channel
            )
        except AuthError as exc:
            log.warning("rejected a Teams request: %s", exc)
            return web.json_response({"error": "unauthorized"}, status=401)
        except UnreachableError as exc:
            log.error("cannot authenticate Teams requests: %s", exc)
            return web.json_response({"error": "authentication unavailable"}, status=503)
        if not activity.service_url.startswith(("https://", "http://")):
            return web.json_response({"error": "no serviceUrl"}, status=400)
        if metrics is not None:
            metrics.event_received("teams")
        status, payload = bot.on_activity(activity)
        headers = {"Retry-After": "5"} if status == 503 else None
        if payload is None:
            return web.Response(status=status, headers=headers)
        return web.json_response(payload, status=status, headers=headers)

    app = web.Application(client_max_size=MAX_BODY_BYTES)
    app.router.add_post(MESSAGES_PATH, messages)
    return app


class TeamsPlatform:
    """The messaging endpoint on a port of its own; replies through the Bot Connector."""

    name = "teams"

    def __init__(self, teams: TeamsSettings, chat: ChatSettings, engine: EngineLike, policy: AccessPolicy, *,
                 metrics: Metrics | None = None, host: str = "0.0.0.0") -> None:
        self.settings = teams
        self.host = host
        self._http = httpx.AsyncClient(timeout=30.0)
        self.bot, auth = build_teams(teams, chat, engine, policy, self._http)
        self._runner = web.AppRunner(build_web_app(self.bot, auth, metrics=metrics), handle_signals=False,
                                     access_log=None)
        self._site: web.TCPSite | None = None
        self.port = teams.port

    def mount(self, app: web.Application) -> None:
        return None  # /api/messages has its own port (EVIDENT_TEAMS_PORT)

    async def start(self) -> None:
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.settings.port)
        try:
            await site.start()
        except OSError as exc:
            raise ConfigError(f"cannot listen on {self.host}:{self.settings.port} (EVIDENT_TEAMS_PORT): "
                              f"{exc.strerror or exc}") from None
        self._site = site
        if self._runner.addresses:
            self.port = int(self._runner.addresses[0][1])
        log.info("Teams endpoint listening on %s:%s%s", self.host, self.port, MESSAGES_PATH)

    async def ready(self) -> None:
        if self._site is None or self.bot.work.closing:
            raise ConnectionError("the Teams endpoint is not accepting activities")

    async def stop_accepting(self) -> None:
        site, self._site = self._site, None
        if site is not None:
            with contextlib.suppress(RuntimeError):
                await site.stop()

    async def drain(self, timeout_s: float) -> int:
        log.info("Teams: shutting down, %d answer(s) in flight", self.bot.in_flight)
        return await self.bot.drain(timeout_s)

    async def close(self) -> None:
        await self._runner.cleanup()
        await self._http.aclose()
