"""Slack's transports (Socket Mode, the HTTP Events API route) and the start-up checks of its tokens."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from aiohttp import web
from slack_bolt.adapter.aiohttp import to_aiohttp_response, to_bolt_request
from slack_bolt.adapter.socket_mode.async_handler import AsyncSocketModeHandler
from slack_bolt.async_app import AsyncApp
from slack_sdk.errors import SlackApiError, SlackClientError
from slack_sdk.web.async_client import AsyncWebClient

from bot.slack.settings import SlackSettings
from pipeline.errors import AuthError, ConfigError, UnreachableError
from pipeline.runtime.metrics import Metrics

log = logging.getLogger("evident.bot")

EVENTS_PATH = "/slack/events"


def check_tokens(settings: SlackSettings) -> None:
    """Raise ConfigError naming the missing/invalid token for the configured transport."""
    bot_token = settings.bot_token.get_secret_value()
    if not bot_token:
        raise ConfigError("SLACK_BOT_TOKEN missing")
    if not bot_token.startswith("xoxb-"):
        raise ConfigError("SLACK_BOT_TOKEN must be a bot token (starts with xoxb-)")
    transport = settings.transport
    if transport == "socket":
        app_token = settings.app_token.get_secret_value()
        if not app_token:
            raise ConfigError("SLACK_APP_TOKEN missing: needed for Socket Mode")
        if not app_token.startswith("xapp-"):
            raise ConfigError("SLACK_APP_TOKEN must be an app-level token (starts with xapp-) "
                              "with the connections:write scope")
    elif not settings.signing_secret.get_secret_value():
        raise ConfigError("SLACK_SIGNING_SECRET missing: needed for the HTTP transport")


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


async def verify_app_token(settings: SlackSettings, client: AsyncWebClient) -> None:
    """Open one Socket Mode connection URL with SLACK_APP_TOKEN, so a wrong or revoked token stops start-up
    with one line naming it (slack_sdk's own connect loop would retry it forever)."""
    app_client = AsyncWebClient(
        token=settings.app_token.get_secret_value(), base_url=client.base_url, timeout=30
    )
    try:
        await app_client.apps_connections_open(app_token=settings.app_token.get_secret_value())
    except SlackApiError as exc:
        code = exc.response.get("error", "unknown_error")
        raise AuthError(f"Slack rejected SLACK_APP_TOKEN (apps.connections.open: {code}); it needs the "
                        "connections:write scope", service="slack", status=exc.response.status_code) from None
    except (TimeoutError, SlackClientError, aiohttp.ClientError, OSError) as exc:
        raise UnreachableError(f"cannot reach Slack for apps.connections.open: {type(exc).__name__}",
                               service="slack") from None


def events_route(app: AsyncApp, path: str = EVENTS_PATH) -> Callable[[web.Application], None]:
    """Mounts Bolt behind ``path`` (its signature verified by Bolt) on an aiohttp app: the HTTP transport."""

    async def events(request: web.Request) -> web.Response:
        try:
            bolt_req = await to_bolt_request(request)
        except ValueError:  # unparsable body (Bolt parses before it verifies the signature)
            return web.Response(status=400, text="malformed request body")
        return await to_aiohttp_response(await app.async_dispatch(bolt_req))

    def mount(web_app: web.Application) -> None:
        web_app.router.add_post(path, events)

    return mount


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
