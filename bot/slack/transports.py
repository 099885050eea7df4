"""Transports (Socket Mode, HTTP Events API) and the bot's process lifecycle.

``run_bot`` fails fast on missing tokens and on a rejected bot token, then serves until SIGINT/SIGTERM
(or ``stop`` is set), stops taking new events, waits for in-flight answers and closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import aiohttp
from aiohttp import web
from slack_bolt.adapter.aiohttp import to_aiohttp_response, to_bolt_request
from slack_bolt.adapter.socket_mode.async_handler import AsyncSocketModeHandler
from slack_bolt.async_app import AsyncApp
from slack_sdk.errors import SlackApiError, SlackClientError
from slack_sdk.web.async_client import AsyncWebClient

from bot.core.contracts import EngineLike
from bot.core.health import Check
from bot.core.lifecycle import Stopped, stop_on_signals, until_stopped
from bot.slack.app import build_bot, make_client
from bot.slack.handlers import EvidentBot
from pipeline.errors import AuthError, ConfigError, UnreachableError
from pipeline.runtime.metrics import Metrics
from pipeline.runtime.settings import Settings

log = logging.getLogger("evident.bot")

EVENTS_PATH = "/slack/events"


class Transport(Protocol):
    async def start(self) -> None: ...
    async def stop_accepting(self) -> None: ...
    async def close(self) -> None: ...


def check_tokens(settings: Settings) -> None:
    """Raise ConfigError naming the missing/invalid token for the configured transport."""
    bot_token = settings.slack_bot_token.reveal()
    if not bot_token:
        raise ConfigError("SLACK_BOT_TOKEN missing")
    if not bot_token.startswith("xoxb-"):
        raise ConfigError("SLACK_BOT_TOKEN must be a bot token (starts with xoxb-)")
    transport = settings.slack_transport
    if transport == "socket":
        app_token = settings.slack_app_token.reveal()
        if not app_token:
            raise ConfigError("SLACK_APP_TOKEN missing: needed for Socket Mode")
        if not app_token.startswith("xapp-"):
            raise ConfigError("SLACK_APP_TOKEN must be an app-level token (starts with xapp-) "
                              "with the connections:write scope")
    elif transport == "http":
        if not settings.slack_signing_secret.reveal():
            raise ConfigError("SLACK_SIGNING_SECRET missing: needed for the HTTP transport")
    else:
        raise ConfigError(f"EVIDENT_SLACK_TRANSPORT must be 'socket' or 'http', not {transport!r}")


async def verify_auth(client: AsyncWebClient) -> dict[str, Any]:
    """Call ``auth.test`` once at start-up so a bad token fails now, with a message saying which."""
    try:
        resp = await client.auth_test()
    except SlackApiError as exc:
        code = exc.response.get("error", "unknown_error")
        raise AuthError(f"Slack rejected SLACK_BOT_TOKEN (auth.test: {code})", service="slack",
                        status=exc.response.status_code) from None
    except (TimeoutError, SlackClientError, aiohttp.ClientError, OSError) as exc:
        raise UnreachableError(f"cannot reach Slack for auth.test: {type(exc).__name__}",
                               service="slack") from None
    return dict(resp.data) if isinstance(resp.data, dict) else {}


async def verify_app_token(settings: Settings, client: AsyncWebClient) -> None:
    """Open one Socket Mode connection URL with SLACK_APP_TOKEN, so a wrong or revoked token stops start-up with
    one line naming it (slack_sdk's own connect loop would retry it forever)."""
    app_client = AsyncWebClient(token=settings.slack_app_token.reveal(), base_url=client.base_url, timeout=30)
    try:
        await app_client.apps_connections_open(app_token=settings.slack_app_token.reveal())
    except SlackApiError as exc:
        code = exc.response.get("error", "unknown_error")
        raise AuthError(f"Slack rejected SLACK_APP_TOKEN (apps.connections.open: {code}); it needs the "
                        "connections:write scope", service="slack", status=exc.response.status_code) from None
    except (TimeoutError, SlackClientError, aiohttp.ClientError, OSError) as exc:
        raise UnreachableError(f"cannot reach Slack for apps.connections.open: {type(exc).__name__}",
                               service="slack") from None


Routes = Callable[[web.Application], None]
"""Adds extra routes to the bot's aiohttp app, e.g. ``functools.partial(bot.core.health.add_health_routes, ...)``."""


def build_web_app(app: AsyncApp | None, *, path: str = EVENTS_PATH, routes: Routes | None = None) -> web.Application:
    """aiohttp application: Bolt behind ``path`` (signature verified by Bolt) plus ``routes``.

    Without ``routes`` a bare ``GET /healthz`` is mounted; pass the health module's routes for the full set.
    ``app=None`` serves only the extra routes (health endpoints next to Socket Mode).
    """

    async def events(request: web.Request) -> web.Response:
        assert app is not None
        try:
            bolt_req = await to_bolt_request(request)
        except ValueError:  # unparsable body (Bolt parses before it verifies the signature)
            return web.Response(status=400, text="malformed request body")
        return await to_aiohttp_response(await app.async_dispatch(bolt_req))

    async def healthz(_request: web.Request) -> web.Response:
        return web.Response(text="ok")

    web_app = web.Application()
    if app is not None:
        web_app.router.add_post(path, events)
    if routes is not None:
        routes(web_app)
    else:
        web_app.router.add_get("/healthz", healthz)
    return web_app


class HttpTransport:
    """Events API over HTTP on ``host:port`` (port 0 picks a free one; see ``port`` after start)."""

    def __init__(self, app: AsyncApp | None, *, host: str = "0.0.0.0", port: int = 3000, path: str = EVENTS_PATH,
                 routes: Routes | None = None) -> None:
        self._runner = web.AppRunner(build_web_app(app, path=path, routes=routes), handle_signals=False,
                                     access_log=None)
        self._host, self._port = host, port
        self._site: web.TCPSite | None = None
        self.port: int = port
        self._what = f"Slack HTTP transport ({EVENTS_PATH})" if app is not None else "HTTP endpoints"

    async def start(self) -> None:
        await self._runner.setup()
        site = web.TCPSite(self._runner, self._host, self._port)
        try:
            await site.start()
        except OSError as exc:
            await self._runner.cleanup()
            raise ConfigError(f"cannot listen on {self._host}:{self._port} (EVIDENT_HTTP_PORT): "
                              f"{exc.strerror or exc}") from None
        self._site = site
        addresses = self._runner.addresses
        if addresses:
            self.port = int(addresses[0][1])
        log.info("%s listening on %s:%s", self._what, self._host, self.port)

    async def stop_accepting(self) -> None:
        if self._site is not None:
            await self._site.stop()
            self._site = None

    async def close(self) -> None:
        await self._runner.cleanup()


class SocketTransport:
    """Socket Mode: one outbound websocket, no public endpoint needed."""

    def __init__(self, app: AsyncApp, app_token: str, client: AsyncWebClient, *,
                 metrics: Metrics | None = None) -> None:
        self._handler = AsyncSocketModeHandler(app, app_token=app_token, web_client=client)
        if metrics is not None:
            self._handler.client.message_listeners.append(_count_hellos(metrics))

    async def start(self) -> None:
        await self._handler.connect_async()
        log.info("Slack Socket Mode connected")

    async def check_connected(self) -> None:
        """A readiness check: raises while the Socket Mode link is down."""
        if not await self._handler.client.is_connected():
            raise ConnectionError("Slack Socket Mode is not connected")

    async def stop_accepting(self) -> None:
        await self._handler.disconnect_async()

    async def close(self) -> None:
        await self._handler.close_async()


def count_events(app: AsyncApp, metrics: Metrics) -> None:
    """Count every request Bolt dispatches (events, commands, actions) and note when the last one came."""

    async def counted(next_: Callable[[], Awaitable[None]]) -> None:
        metrics.event_received("slack")
        await next_()

    app.middleware(counted)


def _count_hellos(metrics: Metrics) -> Callable[..., Awaitable[None]]:
    """A Socket Mode message listener: Slack greets every new connection with ``hello``; beyond the first
    connection, each is a reconnect (a refresh, a dropped link)."""

    async def on_message(_client: object, message: dict[str, Any], _raw: str | None) -> None:
        if message.get("type") == "hello":
            metrics.transport_connected("slack")

    return on_message


async def run_bot(settings: Settings, engine: EngineLike, *, client: AsyncWebClient | None = None,
                  stop: asyncio.Event | None = None, host: str = "0.0.0.0",
                  drain_timeout_s: float | None = None, routes: Routes | None = None,
                  checks: dict[str, Check] | None = None, metrics: Metrics | None = None) -> None:
    """Serve Slack until ``stop`` is set or the process gets SIGINT/SIGTERM, then shut down gracefully:
    answers still running after ``drain_timeout_s`` (default ``EVIDENT_SHUTDOWN_TIMEOUT_S``) are cancelled
    and their threads told so.

    ``routes`` (e.g. health/metrics) are mounted on the HTTP transport's app; in Socket Mode they get their
    own server on ``settings.http_port``, and no port is opened when ``routes`` is None. ``metrics`` counts
    events and Socket Mode (re)connections.
    """
    check_tokens(settings)
    async with contextlib.AsyncExitStack() as stack:
        if client is None:
            session = await stack.enter_async_context(aiohttp.ClientSession())
            client = make_client(settings, session=session)
        drain = settings.shutdown_timeout_s if drain_timeout_s is None else drain_timeout_s
        await _serve(settings, engine, client, stop or asyncio.Event(), host, drain, routes,
                     {} if checks is None else checks, metrics)


async def _serve(settings: Settings, engine: EngineLike, client: AsyncWebClient, stop: asyncio.Event,
                 host: str, drain_timeout_s: float, routes: Routes | None, checks: dict[str, Check],
                 metrics: Metrics | None) -> None:
    ident = await verify_auth(client)
    log.info("connected to Slack as %s (team %s)", ident.get("user", "?"), ident.get("team", "?"))
    bot = build_bot(settings, engine, client=client)
    if metrics is not None:
        count_events(bot.app, metrics)
    transport: Transport
    side: HttpTransport | None = None
    if settings.slack_transport == "http":
        transport = HttpTransport(bot.app, host=host, port=settings.http_port, routes=routes)
    else:
        await verify_app_token(settings, client)
        socket = SocketTransport(bot.app, settings.slack_app_token.reveal(), client, metrics=metrics)
        checks["slack"] = socket.check_connected  # /readyz: not ready while the link is down
        transport = socket
        if routes is not None:
            side = HttpTransport(None, host=host, port=settings.http_port, routes=routes)
    with stop_on_signals(stop):
        await _until_shutdown(bot, transport, side, stop, drain_timeout_s)


async def _until_shutdown(bot: EvidentBot, transport: Transport, side: HttpTransport | None, stop: asyncio.Event,
                          drain_timeout_s: float) -> None:
    try:
        if side is not None:
            await side.start()
        with contextlib.suppress(Stopped):  # a SIGTERM during connect retries is honoured too
            await until_stopped(transport.start(), stop, what="connecting to Slack")
        await stop.wait()
    finally:
        log.info("shutting down: %d answer(s) in flight", bot.in_flight)
        await transport.stop_accepting()
        cancelled = await bot.drain(drain_timeout_s)
        if cancelled:
            log.warning("cancelled %d answer(s) still running after %.0f s", cancelled, drain_timeout_s)
        await transport.close()
        if side is not None:
            await side.stop_accepting()
            await side.close()
