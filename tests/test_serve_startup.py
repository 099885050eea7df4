"""`evident serve` start-up and lifecycle: Qdrant credentials named, an unreachable index retried until a
stop, SIGTERM at any moment, the shutdown bound from settings, and the transport metrics."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web
from fake_slack import EventSender, FakeEngine, FakeSlack, run_bot
from slack_sdk.web.async_client import AsyncWebClient

from bot.core.lifecycle import Stopped
from evident.serve import start_engine
from evident.settings import Settings
from pipeline.errors import AuthError, TransientError, UnreachableError
from pipeline.index.qdrant import QdrantServerIndex
from pipeline.runtime.metrics import Metrics
from tests.test_processes import base_env, free_port

pytestmark = pytest.mark.slow

BOT_TOKEN, APP_TOKEN = "xoxb-start-test", "xapp-1-start-test"


@pytest.fixture
async def qdrant_answering() -> AsyncIterator[tuple[list[int], str]]:
    """A stand-in for a Qdrant server that answers every request with the status in ``status[0]``."""
    status = [401]

    async def any_request(_request: web.Request) -> web.Response:
        return web.json_response({"status": {"error": "nope"}}, status=status[0])

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", any_request)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    yield status, f"http://127.0.0.1:{runner.addresses[0][1]}"
    await runner.cleanup()


async def test_qdrant_open_names_the_rejected_key_and_the_unreachable_url(
        qdrant_answering: tuple[list[int], str]) -> None:
    status, url = qdrant_answering
    index = QdrantServerIndex(url=url, api_key="qdrant-s3cret", collection="evident")
    with pytest.raises(AuthError, match=r"rejected QDRANT_API_KEY \(HTTP 401\)") as err:
        await index.open(dense_dim=4, embedder="e")
    assert "qdrant-s3cret" not in str(err.value)
    status[0] = 503
    with pytest.raises(TransientError, match="HTTP 503"):
        await index.open(dense_dim=4, embedder="e")
    closed = QdrantServerIndex(url=f"http://127.0.0.1:{free_port()}", collection="evident")
    with pytest.raises(UnreachableError, match=r"cannot reach Qdrant .* \(QDRANT_URL\)"):
        await closed.open(dense_dim=4, embedder="e")


async def test_an_unreachable_index_is_retried_until_a_stop(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="evident.serve")
    settings = Settings.load(env={}, data_dir=str(tmp_path), qdrant_url=f"http://127.0.0.1:{free_port()}")
    stop = asyncio.Event()
    starting = asyncio.create_task(start_engine(settings, Metrics(), stop))
    for _ in range(400):
        if caplog.text.count("cannot reach Qdrant") >= 2:  # retried, with backoff
            break
        await asyncio.sleep(0.05)
    assert caplog.text.count("cannot reach Qdrant") >= 2, caplog.text
    assert (
        "not ready: opening the index and models failed (UnreachableError: cannot reach Qdrant" in caplog.text
    )
    assert not starting.done()
    t0 = asyncio.get_running_loop().time()
    stop.set()  # what SIGTERM does
    with pytest.raises(Stopped):
        await asyncio.wait_for(starting, 10)
    assert asyncio.get_running_loop().time() - t0 < 2


async def test_a_rejected_qdrant_key_stops_start_up_at_once(tmp_path: Path,
                                                            qdrant_answering: tuple[list[int], str]) -> None:
    _status, url = qdrant_answering
    settings = Settings.load(env={}, data_dir=str(tmp_path), qdrant_url=url, qdrant_api_key="qdrant-s3cret")
    with pytest.raises(AuthError, match="QDRANT_API_KEY"):
        await asyncio.wait_for(start_engine(settings, Metrics(), asyncio.Event()), 120)


async def test_sigterm_during_start_up_exits_cleanly_and_a_bad_key_exits_2(
        tmp_path: Path, qdrant_answering: tuple[list[int], str]) -> None:
    """Real processes: SIGTERM while serve waits for Qdrant ends it with exit 0 within seconds; a rejected
    QDRANT_API_KEY ends it with exit 2 and one line naming the setting, never the key."""
    status, url = qdrant_answering
    env = {**base_env(tmp_path), "SLACK_BOT_TOKEN": BOT_TOKEN, "SLACK_APP_TOKEN": APP_TOKEN,
           "QDRANT_URL": f"http://127.0.0.1:{free_port()}"}
    serve = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "evident",
        "serve",
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert serve.stderr is not None
    seen = b""
    while b"not ready" not in seen:  # the model has loaded; start-up now waits for the index
        line = await asyncio.wait_for(serve.stderr.readline(), 120)
        assert line, seen.decode()[-2000:]
        seen += line
    t0 = asyncio.get_running_loop().time()
    serve.send_signal(signal.SIGTERM)
    _, err = await asyncio.wait_for(serve.communicate(), 30)
    assert serve.returncode == 0, (seen + err).decode()[-2000:]
    assert asyncio.get_running_loop().time() - t0 < 15

    status[0] = 403
    bad = {**env, "QDRANT_URL": url, "QDRANT_API_KEY": "qdrant-s3cret"}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "evident",
        "serve",
        env=bad,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    text = (out + err).decode()
    assert proc.returncode == 2, text[-2000:]
    errors = [line for line in text.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "QDRANT_API_KEY (HTTP 403)" in errors[0], text[-2000:]
    assert "qdrant-s3cret" not in text


async def test_socket_mode_counts_events_and_reconnects_and_drains_by_the_setting() -> None:
    slack = await FakeSlack().start()
    try:
        settings = Settings.load(env={}, slack_bot_token=BOT_TOKEN, slack_app_token=APP_TOKEN,
                                 shutdown_timeout_s=0.3, http_port=0)
        metrics, stop = Metrics(), asyncio.Event()
        client = AsyncWebClient(token=BOT_TOKEN, base_url=slack.base_url)
        runner = asyncio.create_task(run_bot(settings, FakeEngine(delay_s=30), client=client, stop=stop,
                                             metrics=metrics))
        await slack.wait_for(lambda: metrics.connects.value(platform="slack") == 1)
        assert metrics.seconds_since_event("slack") is None
        await slack.socket_send({"type": "disconnect", "reason": "refresh_requested"})
        await slack.wait_for(lambda: metrics.reconnects.value(platform="slack") == 1)
        mention = EventSender("unused").mention("vpn?")
        await slack.socket_send(
            {
                "envelope_id": "e1",
                "type": "events_api",
                "payload": EventSender("unused").envelope(mention),
                "accepts_response_payload": False,
                "retry_attempt": 0,
                "retry_reason": "",
            }
        )
        await slack.wait_calls("chat.startStream")  # the 30 s answer is running, streamed into its thread
        assert metrics.events.value(platform="slack") == 1
        age = metrics.seconds_since_event("slack")
        assert age is not None and age < 5
        assert 'evident_seconds_since_last_event{platform="slack"}' in metrics.render()
        t0 = asyncio.get_running_loop().time()
        stop.set()
        await asyncio.wait_for(runner, 10)
        assert asyncio.get_running_loop().time() - t0 < 6  # EVIDENT_SHUTDOWN_TIMEOUT_S=0.3, not 30 s
        (stopped,) = slack.of("chat.stopStream")  # said in the stream, which it ends
        said = stopped.get("markdown_text") or "".join(c.get("text", "") for c in stopped.get("chunks") or [])
        assert "restarting" in said, stopped
    finally:
        await slack.stop()


def test_transport_metrics_in_the_exposition() -> None:
    metrics = Metrics()
    metrics.event_received("teams")
    metrics.transport_connected("slack")
    metrics.transport_connected("slack")
    text = metrics.render()
    assert 'evident_events_total{platform="teams"} 1.0' in text
    assert 'evident_transport_reconnects_total{platform="slack"} 1.0' in text
    assert 'evident_transport_connects_total{platform="slack"} 2.0' in text
