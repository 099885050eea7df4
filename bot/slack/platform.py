"""Slack as a ``bot.core.platform.Platform``: Socket Mode (one outbound websocket) or the HTTP Events API
(a route on the shared HTTP server), with the token checks that make a wrong token stop start-up."""

from __future__ import annotations

import logging

import aiohttp
from aiohttp import web
from slack_sdk.web.async_client import AsyncWebClient

from bot.core.access import AccessPolicy
from bot.core.contracts import EngineLike
from bot.core.settings import ChatSettings
from bot.slack.app import build_bot, make_client
from bot.slack.settings import SlackSettings
from bot.slack.transports import (
    SocketTransport,
    check_tokens,
    count_events,
    events_route,
    verify_app_token,
    verify_auth,
)
from pipeline.runtime.metrics import Metrics

log = logging.getLogger("evident.bot")


class SlackPlatform:
    name = "slack"

    def __init__(self, slack: SlackSettings, chat: ChatSettings, engine: EngineLike, policy: AccessPolicy, *,
                 client: AsyncWebClient | None = None, metrics: Metrics | None = None) -> None:
        check_tokens(slack)  # no network before the configuration is complete
        self.settings = slack
        self._session: aiohttp.ClientSession | None = None
        if client is None:  # one long-lived session: no new connection and TLS handshake per call
            self._session = aiohttp.ClientSession()
            client = make_client(slack, session=self._session)
        self.client = client
        self.bot = build_bot(slack, chat, engine, policy, client=client)
        self.metrics = metrics
        if metrics is not None:
            count_events(self.bot.app, metrics)
        self._socket: SocketTransport | None = None
        self._started = False

    def mount(self, app: web.Application) -> None:
        if self.settings.transport == "http":
            events_route(self.bot.app)(app)

    async def start(self) -> None:
        ident = await verify_auth(self.client)
        log.info("connected to Slack as %s (team %s)", ident.get("user", "?"), ident.get("team", "?"))
        if self.settings.transport == "socket":
            await verify_app_token(self.settings, self.client)
            self._socket = SocketTransport(
                self.bot.app, self.settings.app_token.get_secret_value(), self.client, metrics=self.metrics
            )
            await self._socket.start()
        self._started = True

    async def ready(self) -> None:
        if self._socket is not None:
            await self._socket.check_connected()
        elif not self._started or self.bot.work.closing:
            raise ConnectionError("Slack events are not being accepted")

    async def stop_accepting(self) -> None:
        if self._socket is not None:
            await self._socket.stop_accepting()

    async def drain(self, timeout_s: float) -> int:
        log.info("Slack: shutting down, %d answer(s) in flight", self.bot.in_flight)
        return await self.bot.drain(timeout_s)

    async def close(self) -> None:
        if self._socket is not None:
            await self._socket.close()
        if self._session is not None:
            await self._session.close()
