"""The Teams messaging endpoint (``POST /api/messages``) and how `evident serve` runs it.

Each request is authenticated (``bot.teams.auth``), parsed, handed to ``TeamsBot`` and answered at once:
200 for activities (the answer follows through the Bot Connector), the invoke response for invokes, 401 for a
request that is not from the Bot Framework, 400 for a body that is not an activity.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable

import httpx
from aiohttp import web

from bot.core.contracts import EngineLike
from bot.core.health import Check
from bot.teams.activity import Activity
from bot.teams.auth import ActivityAuth, AppTokens
from bot.teams.connector import ConnectorClient
from bot.teams.handlers import TeamsBot
from pipeline.errors import AuthError, ConfigError, UnreachableError
from pipeline.runtime.metrics import Metrics
from pipeline.runtime.settings import Settings

log = logging.getLogger("evident.teams")

MESSAGES_PATH = "/api/messages"
MAX_BODY_BYTES = 1_000_000
Routes = Callable[[web.Application], None]


def check_teams_settings(settings: Settings) -> None:
    if not settings.teams_app_id:
        raise ConfigError("TEAMS_APP_ID missing: the Azure Bot's Microsoft App ID")
    if not settings.teams_app_password.reveal():
        raise ConfigError("TEAMS_APP_PASSWORD missing: a client secret of the bot's app registration")
    if not (settings.teams_tenant_id or settings.teams_token_url):
        raise ConfigError("TEAMS_TENANT_ID missing: the tenant of the (single-tenant) bot registration")


def token_url(settings: Settings) -> str:
    return settings.teams_token_url or f"https://login.microsoftonline.com/{settings.teams_tenant_id}/oauth2/v2.0/token"


def build_teams(settings: Settings, engine: EngineLike, http: httpx.AsyncClient) -> tuple[TeamsBot, ActivityAuth]:
    check_teams_settings(settings)
    assert settings.teams_app_id is not None
    tokens = AppTokens(http, app_id=settings.teams_app_id, password=settings.teams_app_password.reveal(),
                       token_url=token_url(settings))
    auth = ActivityAuth(http, app_id=settings.teams_app_id, openid_url=settings.teams_openid_url,
                        tenant_id=settings.teams_tenant_id, tenant_openid=settings.teams_tenant_openid_url)
    return TeamsBot(settings, engine, ConnectorClient(http, tokens)), auth


def build_web_app(bot: TeamsBot, auth: ActivityAuth, *, routes: Routes | None = None,
                  metrics: Metrics | None = None) -> web.Application:
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
            await auth.verify(request.headers.get("Authorization"), activity.service_url, activity.bot_channel)
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
    if routes is not None:
        routes(app)
    return app


async def run_teams(settings: Settings, engine: EngineLike, stop: asyncio.Event, *, host: str = "0.0.0.0",
                    drain_timeout_s: float | None = None, routes: Routes | None = None,
                    started: Callable[[int], None] | None = None, checks: dict[str, Check] | None = None,
                    metrics: Metrics | None = None) -> None:
    """Serve the Teams endpoint on ``EVIDENT_TEAMS_PORT`` until ``stop`` is set; answers still running
    ``drain_timeout_s`` later (default ``EVIDENT_SHUTDOWN_TIMEOUT_S``) are cancelled and their chats told so."""
    drain = settings.shutdown_timeout_s if drain_timeout_s is None else drain_timeout_s
    async with httpx.AsyncClient(timeout=30.0) as http:
        bot, auth = build_teams(settings, engine, http)
        runner = web.AppRunner(build_web_app(bot, auth, routes=routes, metrics=metrics), handle_signals=False,
                               access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, host, settings.teams_port)
        try:
            await site.start()
        except OSError as exc:
            await runner.cleanup()
            raise ConfigError(f"cannot listen on {host}:{settings.teams_port} (EVIDENT_TEAMS_PORT): "
                              f"{exc.strerror or exc}") from None
        port = int(runner.addresses[0][1]) if runner.addresses else settings.teams_port
        log.info("Teams endpoint listening on %s:%s%s", host, port, MESSAGES_PATH)
        listening = True

        async def teams_listening() -> None:
            if not listening:
                raise ConnectionError("the Teams endpoint is not accepting activities")

        if checks is not None:
            checks["teams"] = teams_listening
        if started is not None:
            started(port)
        try:
            await stop.wait()
        finally:
            listening = False
            log.info("Teams: shutting down, %d answer(s) in flight", bot.in_flight)
            with contextlib.suppress(Exception):
                await site.stop()
            cancelled = await bot.drain(drain)
            if cancelled:
                log.warning("Teams: cancelled %d answer(s) still running", cancelled)
            await runner.cleanup()
