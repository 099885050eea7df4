"""Factories for the Bolt app. Nothing is created at import time: settings and engine come in."""

from __future__ import annotations

import aiohttp
from slack_bolt.async_app import AsyncApp
from slack_sdk.http_retry.builtin_async_handlers import (
    AsyncConnectionErrorRetryHandler,
    AsyncRateLimitErrorRetryHandler,
)
from slack_sdk.web.async_client import AsyncWebClient

from bot.core.access import AccessPolicy
from bot.core.contracts import EngineLike
from bot.core.ratelimit import UserRateLimiter
from bot.core.settings import ChatSettings
from bot.slack.handlers import EvidentBot
from bot.slack.settings import SlackSettings


def make_client(slack: SlackSettings, *, base_url: str | None = None,
                session: aiohttp.ClientSession | None = None) -> AsyncWebClient:
    """The Web API client with retries for connection errors and for 429 (honours Retry-After).

    Pass a long-lived ``session`` in servers: without one the SDK opens a new connection (and TLS
    handshake) for every call.
    """
    url = base_url or slack.api_url or AsyncWebClient.BASE_URL
    client = AsyncWebClient(token=slack.bot_token.get_secret_value() or None, timeout=30,
                            base_url=url if url.endswith("/") else url + "/", session=session)
    ensure_retry_handlers(client)
    return client


def ensure_retry_handlers(client: AsyncWebClient) -> AsyncWebClient:
    """Add the 429 and connection-error retry handlers to ``client`` if it lacks them."""
    kinds = {type(h) for h in client.retry_handlers}
    if AsyncConnectionErrorRetryHandler not in kinds:
        client.retry_handlers.append(AsyncConnectionErrorRetryHandler())
    if AsyncRateLimitErrorRetryHandler not in kinds:
        client.retry_handlers.append(AsyncRateLimitErrorRetryHandler(max_retry_count=2))
    return client


def build_bot(
    slack: SlackSettings,
    chat: ChatSettings,
    engine: EngineLike,
    policy: AccessPolicy,
    *,
    client: AsyncWebClient | None = None,
    request_verification_enabled: bool | None = None,
    limiter: UserRateLimiter | None = None,
) -> EvidentBot:
    """The bot with its Bolt app attached as ``bot.app``.

    ``request_verification_enabled`` defaults to "a signing secret is configured": the HTTP transport
    requires one (see :func:`bot.slack.transports.check_tokens`), Socket Mode does not use it.
    """
    client = ensure_retry_handlers(client or make_client(slack))
    secret = slack.signing_secret.get_secret_value()
    verify = bool(secret) if request_verification_enabled is None else request_verification_enabled
    app = AsyncApp(
        name="evident",
        client=client,
        signing_secret=secret,
        request_verification_enabled=verify,
        process_before_response=False,
    )
    bot = EvidentBot(slack, chat, engine, client, policy, limiter=limiter)
    bot.register(app)
    return bot
