"""Health endpoints over real HTTP on 127.0.0.1: liveness, readiness with real checks, metrics."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web

from bot.core.health import HealthServer, add_health_routes, evaluate_readiness, http_get_check
from pipeline.errors import AuthError, UnreachableError
from pipeline.runtime.loop_watch import LoopWatch
from pipeline.runtime.metrics import Metrics


class LLMStub:
    """A tiny OpenAI-compatible endpoint: ``GET /v1/models`` like vLLM/Ollama answer it."""

    def __init__(self, status: int = 200) -> None:
        self.status = status
        self.runner: web.AppRunner | None = None
        self.port = 0

    async def _models(self, request: web.Request) -> web.Response:
        if self.status != 200:
            return web.json_response({"error": {"message": "nope"}}, status=self.status)
        return web.json_response({"object": "list", "data": [{"id": "tiny", "object": "model"}]})

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/v1/models", self._models)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", self.port).start()
        self.port = int(self.runner.addresses[0][1])

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None

    @property
    def models_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1/models"


@pytest.fixture
async def llm() -> AsyncIterator[LLMStub]:
    stub = LLMStub()
    await stub.start()
    yield stub
    await stub.stop()


async def _get(url: str) -> tuple[int, str, str]:
    async with aiohttp.ClientSession() as s, s.get(url) as r:
        return r.status, r.headers.get("Content-Type", ""), await r.text()


async def test_ready_then_not_ready_when_the_llm_stops(llm: LLMStub) -> None:
    checks = {"llm": http_get_check(llm.models_url, timeout_s=2)}
    async with HealthServer(0, checks, Metrics(), host="127.0.0.1") as server:
        status, ctype, body = await _get(server.url + "/readyz")
        assert status == 200, body
        assert ctype.startswith("application/json")
        payload = json.loads(body)
        assert payload["ready"] is True
        assert payload["checks"]["llm"]["ok"] is True

        await llm.stop()
        status, _, body = await _get(server.url + "/readyz")
        assert status == 503
        payload = json.loads(body)
        assert payload["failed"] == ["llm"]
        assert "UnreachableError" in payload["checks"]["llm"]["error"]

        # Liveness does not depend on the LLM.
        assert (await _get(server.url + "/healthz"))[::2] == (200, "ok")
        status, _, body = await _get(server.url + "/livez")
        live = json.loads(body)
        assert status == 200 and live["live"] is True and 0 <= live["loop_lag_ms"] < 1000


async def test_a_raising_check_is_named_in_the_503() -> None:
    async def store_ok() -> None:
        return None

    async def index_broken() -> None:
        raise RuntimeError("segment file missing")

    async with HealthServer(
        0, {"store": store_ok, "index": index_broken}, Metrics(), host="127.0.0.1"
    ) as server:
        status, _, body = await _get(server.url + "/readyz")
    assert status == 503
    payload = json.loads(body)
    assert payload["ready"] is False
    assert payload["failed"] == ["index"]
    assert payload["checks"]["store"]["ok"] is True
    assert "segment file missing" in payload["checks"]["index"]["error"]


async def test_slow_check_times_out() -> None:
    async def hangs() -> None:
        await asyncio.sleep(10)

    result = await evaluate_readiness({"slow": hangs}, check_timeout_s=0.05)
    assert not result.ready
    assert result.failed == ("slow",)
    assert "timed out" in str(result.body["checks"]["slow"])  # type: ignore[index]


@pytest.mark.parametrize(("age", "ready"), [(None, False), (10.0, True), (5000.0, False)])
async def test_sync_freshness_rule(age: float | None, ready: bool) -> None:
    result = await evaluate_readiness({}, last_sync_age=lambda: age, max_sync_age_s=3600)
    assert result.ready is ready
    assert ("sync" in result.failed) is (not ready)


async def test_http_check_maps_auth_failures() -> None:
    stub = LLMStub(status=401)
    await stub.start()
    try:
        with pytest.raises(AuthError):
            await http_get_check(stub.models_url)()
    finally:
        await stub.stop()
    with pytest.raises(UnreachableError):
        await http_get_check(stub.models_url)()


async def test_metrics_endpoint_serves_the_registry_and_parses() -> None:
    parser = pytest.importorskip("prometheus_client.parser")
    metrics = Metrics()
    metrics.questions.inc()
    metrics.questions.inc()
    async with HealthServer(0, {}, metrics, host="127.0.0.1") as server:
        status, ctype, text = await _get(server.url + "/metrics")
        assert status == 200
        assert ctype.startswith("text/plain") and "version=0.0.4" in ctype
        values = {s.name: s.value for f in parser.text_string_to_metric_families(text) for s in f.samples}
        assert values["evident_questions_total"] == 2
        metrics.questions.inc()
        _, _, text = await _get(server.url + "/metrics")
        assert "evident_questions_total 3.0" in text


async def test_metrics_count_the_loop_s_tasks_and_its_blocks() -> None:
    parser = pytest.importorskip("prometheus_client.parser")
    metrics = Metrics()
    async with HealthServer(0, {}, metrics, host="127.0.0.1") as server:
        _, _, text = await _get(server.url + "/metrics")
        idle = {s.name: s.value for f in parser.text_string_to_metric_families(text) for s in f.samples}
        sleepers = [asyncio.create_task(asyncio.sleep(30)) for _ in range(5)]
        async with LoopWatch(0.05, on_block=metrics.loop_blocks.inc).watching():
            await asyncio.sleep(0.1)
            time.sleep(0.3)  # noqa: ASYNC251 - the block the watch must count
            await asyncio.sleep(0.1)
            _, _, text = await _get(server.url + "/metrics")
        for task in sleepers:
            task.cancel()
    busy = {s.name: s.value for f in parser.text_string_to_metric_families(text) for s in f.samples}
    assert busy["evident_event_loop_tasks"] >= idle["evident_event_loop_tasks"] + 5 + 1  # + the heartbeat
    assert idle["evident_event_loop_blocks_total"] == 0 and busy["evident_event_loop_blocks_total"] >= 1


async def test_routes_mount_on_an_existing_app() -> None:
    app = web.Application()

    async def events(_: web.Request) -> web.Response:
        return web.Response(text="slack")

    app.router.add_post("/slack/events", events)
    add_health_routes(app, checks={}, metrics=Metrics())
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    base = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        assert (await _get(base + "/healthz"))[0] == 200
        assert (await _get(base + "/readyz"))[0] == 200
        assert (await _get(base + "/metrics"))[0] == 200
    finally:
        await runner.cleanup()


async def test_loop_lag_sees_a_blocked_event_loop() -> None:
    import time as _time

    from bot.core.health import loop_lag_s

    measuring = asyncio.ensure_future(loop_lag_s())
    await asyncio.sleep(0)  # the measurement queues its callback
    _time.sleep(0.3)  # noqa: ASYNC251 - the point: a blocking call holds the loop before the callback runs
    assert await measuring >= 0.25
    assert await loop_lag_s() < 0.1  # quiet again
