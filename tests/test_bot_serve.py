"""Slack as `evident serve` runs it (``serve_platforms`` with a ``SlackPlatform``): Socket Mode over a real
local websocket, the HTTP transport on the shared server, fail-fast start-up, shutdown."""

from __future__ import annotations

import asyncio
import socket
import urllib.parse
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from fake_slack import SIGNING_SECRET, EventSender, FakeEngine, FakeSlack, run_bot
from slack_sdk.web.async_client import AsyncWebClient

from bot.slack.app import build_bot
from evident.platforms import access_policy
from evident.settings import Settings
from pipeline.errors import AuthError, ConfigError, UnreachableError

BOT_TOKEN = "xoxb-serve-test"
APP_TOKEN = "xapp-1-serve-test"


@pytest.fixture
async def slack() -> AsyncIterator[FakeSlack]:
    fake = await FakeSlack().start()
    yield fake
    await fake.stop()


def _client(slack: FakeSlack) -> AsyncWebClient:
    return AsyncWebClient(token=BOT_TOKEN, base_url=slack.base_url)


def _envelope(envelope_id: str, kind: str, payload: dict[str, Any]) -> dict[str, Any]:
    return {"envelope_id": envelope_id, "type": kind, "payload": payload,
            "accepts_response_payload": kind != "events_api", "retry_attempt": 0, "retry_reason": ""}


async def test_socket_mode_end_to_end_and_graceful_shutdown(slack: FakeSlack) -> None:
    settings = Settings.load(env={}, slack_bot_token=BOT_TOKEN, slack_app_token=APP_TOKEN, http_port=0)
    engine = FakeEngine(delay_s=0.2)
    stop = asyncio.Event()
    runner = asyncio.create_task(run_bot(settings, engine, client=_client(slack), stop=stop))
    events = EventSender("unused")
    mention = events.mention("How do I get VPN access?")
    await slack.socket_send(_envelope("env-1", "events_api", events.envelope(mention)))
    await slack.wait_for(lambda: any(a.get("envelope_id") == "env-1" for a in slack.socket_acks))
    await slack.wait_calls("chat.startStream")  # the answer streams into the mention's thread
    assert slack.of("apps.connections.open")[0]["_token"] == APP_TOKEN
    assert not slack.of("chat.update")  # the ack came long before the (slow) answer

    command = {"token": "legacy", "team_id": "T1", "channel_id": "C1", "user_id": "U1", "command": "/ask",
               "text": "holidays?", "response_url": f"{slack.url}/response/r9", "trigger_id": "t9"}
    await slack.socket_send(_envelope("env-2", "slash_commands", command))
    await slack.wait_for(lambda: any(a.get("envelope_id") == "env-2" for a in slack.socket_acks))
    await slack.wait_calls("chat.postMessage", 1)  # /ask at the top of a channel: the placeholder

    stop.set()  # shutdown while both answers are still in flight: they must still be delivered
    await asyncio.wait_for(runner, 10)
    updates = slack.of("chat.update")
    assert len(updates) == 2 and len(slack.of("chat.stopStream")) == 1
    assert {a.question for a in engine.asks} == {"How do I get VPN access?", "holidays?"}


async def test_http_transport_via_run_bot(slack: FakeSlack) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    settings = Settings.load(env={}, slack_bot_token=BOT_TOKEN, slack_signing_secret=SIGNING_SECRET,
                             slack_transport="http", http_port=port)
    stop = asyncio.Event()
    runner = asyncio.create_task(run_bot(settings, FakeEngine(), client=_client(slack), stop=stop,
                                         host="127.0.0.1"))
    url = f"http://127.0.0.1:{port}"
    async with aiohttp.ClientSession() as http:
        for _ in range(200):
            try:
                async with http.get(f"{url}/healthz") as resp:
                    assert await resp.text() == "ok"
                    break
            except aiohttp.ClientConnectionError:
                await asyncio.sleep(0.01)
        body = urllib.parse.urlencode({"type": "url_verification", "challenge": "abc"})
        async with EventSender(f"{url}/slack/events") as send:
            status, text, _ = await send.post_raw(
                '{"type": "url_verification", "challenge": "abc", "token": "x"}', "application/json"
            )
            assert status == 200 and "abc" in text
            status, _, _ = await send.post_raw(body, "application/json")
            assert status == 400  # not JSON
            status, _, _ = await send.post_raw('{"type": "url_verification", "challenge": "abc"}',
                                               "application/json", secret="not-the-secret")
            assert status == 401
            await send.event(send.mention("vpn?"))
    await slack.wait_calls("chat.update")
    stop.set()
    await asyncio.wait_for(runner, 10)


async def test_shutdown_that_gives_up_on_an_answer_tells_the_thread(slack: FakeSlack) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    settings = Settings.load(env={}, slack_bot_token=BOT_TOKEN, slack_signing_secret=SIGNING_SECRET,
                             slack_transport="http", http_port=port)
    stop = asyncio.Event()
    runner = asyncio.create_task(run_bot(settings, FakeEngine(delay_s=30), client=_client(slack), stop=stop,
                                         host="127.0.0.1", drain_timeout_s=0.3))
    async with EventSender(f"http://127.0.0.1:{port}/slack/events") as send:
        for _ in range(200):
            try:
                await send.event(send.mention("vpn?"))
                break
            except aiohttp.ClientConnectionError:
                await asyncio.sleep(0.01)
        await slack.wait_calls("chat.startStream")  # the answer is being computed and streamed
    t0 = asyncio.get_running_loop().time()
    stop.set()
    await asyncio.wait_for(runner, 10)
    assert asyncio.get_running_loop().time() - t0 < 6  # bounded: drain timeout + the short notice
    (stop_call,) = slack.of("chat.stopStream")  # said in the streamed message, which it ends
    assert "restarting" in stop_call["markdown_text"], stop_call


async def test_run_bot_fails_fast_on_missing_tokens(slack: FakeSlack) -> None:
    with pytest.raises(ConfigError, match="SLACK_APP_TOKEN missing: needed for Socket Mode"):
        await run_bot(Settings.load(env={}, slack_bot_token=BOT_TOKEN, http_port=0), FakeEngine(),
                      client=_client(slack))
    assert slack.calls == []  # no network before the configuration is complete


async def test_run_bot_reports_rejected_token(slack: FakeSlack) -> None:
    slack.auth_error = "invalid_auth"
    settings = Settings.load(env={}, slack_bot_token=BOT_TOKEN, slack_app_token=APP_TOKEN, http_port=0)
    with pytest.raises(AuthError, match=r"Slack rejected SLACK_BOT_TOKEN \(auth.test: invalid_auth\)") as err:
        await run_bot(settings, FakeEngine(), client=_client(slack))
    assert BOT_TOKEN not in str(err.value)


async def test_run_bot_stops_at_a_rejected_app_token_without_a_connect_loop(slack: FakeSlack) -> None:
    slack.fail_next("apps.connections.open", error="invalid_auth")
    settings = Settings.load(env={}, slack_bot_token=BOT_TOKEN, slack_app_token=APP_TOKEN, http_port=0)
    with pytest.raises(
        AuthError, match=r"Slack rejected SLACK_APP_TOKEN \(apps.connections.open: invalid_auth\)"
    ) as err:
        await asyncio.wait_for(run_bot(settings, FakeEngine(), client=_client(slack)), 10)
    assert APP_TOKEN not in str(err.value)
    assert len(slack.of("apps.connections.open")) == 1  # one call, no retry loop


async def test_stop_while_socket_mode_is_still_connecting_is_honoured(slack: FakeSlack) -> None:
    # the start-up check passes, the connect itself never answers
    slack.hang_from["apps.connections.open"] = 1
    settings = Settings.load(env={}, slack_bot_token=BOT_TOKEN, slack_app_token=APP_TOKEN, http_port=0)
    stop = asyncio.Event()
    runner = asyncio.create_task(run_bot(settings, FakeEngine(), client=_client(slack), stop=stop))
    await slack.wait_for(lambda: len(slack.of("apps.connections.open")) >= 2)
    t0 = asyncio.get_running_loop().time()
    stop.set()  # what SIGTERM does
    await asyncio.wait_for(runner, 10)
    assert asyncio.get_running_loop().time() - t0 < 5


async def test_socket_mode_link_is_a_readiness_check(slack: FakeSlack) -> None:
    settings = Settings.load(env={}, slack_bot_token=BOT_TOKEN, slack_app_token=APP_TOKEN, http_port=0)
    checks: dict[str, Any] = {}
    stop = asyncio.Event()
    runner = asyncio.create_task(
        run_bot(settings, FakeEngine(), client=_client(slack), stop=stop, checks=checks)
    )
    await slack.wait_for(lambda: "slack" in checks and len(slack.of("apps.connections.open")) >= 2)
    for _ in range(50):  # the link comes up right after the connection URL is handed out
        try:
            await checks["slack"]()
            break
        except ConnectionError:
            await asyncio.sleep(0.05)
    await checks["slack"]()  # connected: ready
    stop.set()
    await asyncio.wait_for(runner, 10)
    with pytest.raises(ConnectionError, match="not connected"):
        await checks["slack"]()


async def test_run_bot_reports_unreachable_slack() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    settings = Settings.load(env={}, slack_bot_token=BOT_TOKEN, slack_app_token=APP_TOKEN, http_port=0)
    client = AsyncWebClient(token=BOT_TOKEN, base_url=f"http://127.0.0.1:{port}/api/", retry_handlers=[])
    with pytest.raises(UnreachableError, match=r"cannot reach Slack for auth\.test"):
        await run_bot(settings, FakeEngine(), client=client)


async def test_build_app_accepts_a_client_and_adds_rate_limit_retries(slack: FakeSlack) -> None:
    client = _client(slack)
    settings = Settings.load(env={}, slack_bot_token=BOT_TOKEN, slack_app_token=APP_TOKEN, http_port=0)
    engine = FakeEngine()
    app = build_bot(settings.slack, settings.chat, engine, access_policy(settings, engine), client=client).app
    assert app.client is client
    assert "AsyncRateLimitErrorRetryHandler" in {type(h).__name__ for h in client.retry_handlers}


async def test_http_port_in_use_is_a_clear_config_error(slack: FakeSlack) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        settings = Settings.load(env={}, slack_bot_token=BOT_TOKEN, slack_signing_secret=SIGNING_SECRET,
                                 slack_transport="http", http_port=busy.getsockname()[1])
        with pytest.raises(ConfigError, match="EVIDENT_HTTP_PORT"):
            await run_bot(settings, FakeEngine(), client=_client(slack), host="127.0.0.1")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _get_when_up(url: str) -> tuple[int, str]:
    async with aiohttp.ClientSession() as http:
        for _ in range(300):
            try:
                async with http.get(url) as resp:
                    return resp.status, await resp.text()
            except aiohttp.ClientConnectionError:
                await asyncio.sleep(0.01)
    raise AssertionError(f"{url} never came up")


async def test_extra_routes_next_to_socket_mode_and_on_the_http_transport(slack: FakeSlack) -> None:
    def routes(app: web.Application) -> None:
        async def ping(_: web.Request) -> web.Response:
            return web.Response(text="pong")

        app.router.add_get("/healthz", ping)

    for transport in ("socket", "http"):
        port = _free_port()
        settings = Settings.load(
            env={},
            slack_bot_token=BOT_TOKEN,
            slack_app_token=APP_TOKEN,
            slack_signing_secret=SIGNING_SECRET,
            slack_transport=transport,
            http_port=port,
        )
        stop = asyncio.Event()
        runner = asyncio.create_task(run_bot(settings, FakeEngine(), client=_client(slack), stop=stop,
                                             host="127.0.0.1", routes=routes))
        assert await _get_when_up(f"http://127.0.0.1:{port}/healthz") == (200, "pong")
        stop.set()
        await asyncio.wait_for(runner, 10)
