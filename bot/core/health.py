"""Liveness, readiness and metrics endpoints for orchestrators (Docker HEALTHCHECK, Kubernetes, Prometheus).

``/healthz`` only proves the event loop answers, so a slow LLM never gets the process restarted.
``/readyz`` runs the dependency checks (LLM endpoint, index, store ...) and the sync-freshness rule, so
traffic or alerts can react to "alive but cannot answer well". ``/metrics`` serves the ``Metrics`` registry.
In Socket Mode ``HealthServer`` listens on its own port; the HTTP transport mounts the same routes on its app
with ``add_health_routes``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

import aiohttp
from aiohttp import web

from pipeline.errors import AuthError, NotFoundError, RemoteError, TransientError, UnreachableError
from pipeline.runtime.metrics import CONTENT_TYPE, Metrics

log = logging.getLogger(__name__)

Check = Callable[[], Awaitable[None]]
"""A readiness check: returns when the dependency is usable, raises (any exception) when it is not."""

DEFAULT_CHECK_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class Readiness:
    """The outcome of one readiness evaluation; ``body`` is what ``/readyz`` returns as JSON."""

    ready: bool
    failed: tuple[str, ...]
    body: dict[str, object]


async def _run_check(name: str, check: Check, timeout_s: float) -> dict[str, object]:
    start = time.perf_counter()
    try:
        async with asyncio.timeout(timeout_s):
            await check()
    except TimeoutError:
        return {"ok": False, "error": f"timed out after {timeout_s:g} s"}
    except Exception as exc:  # a probe must report any failure, never crash the endpoint
        log.debug("readiness check %s failed", name, exc_info=True)
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:300]}
    return {"ok": True, "ms": round((time.perf_counter() - start) * 1000, 1)}


def _sync_result(age_s: float | None, max_age_s: float) -> dict[str, object]:
    if age_s is None:
        return {"ok": False, "error": "no sync has completed yet"}
    if age_s > max_age_s:
        return {
            "ok": False,
            "age_s": round(age_s, 1),
            "error": f"last sync {age_s:.0f} s ago (max {max_age_s:g} s)",
        }
    return {"ok": True, "age_s": round(age_s, 1)}


async def evaluate_readiness(
    checks: Mapping[str, Check],
    *,
    last_sync_age: Callable[[], float | None] | None = None,
    max_sync_age_s: float | None = None,
    check_timeout_s: float = DEFAULT_CHECK_TIMEOUT_S,
) -> Readiness:
    """Run all checks concurrently (each bounded by ``check_timeout_s``) plus the sync-freshness rule.

    ``last_sync_age`` is called on the event loop, so it must be cheap (e.g. return a cached timestamp's age);
    ``None`` from it means no sync finished yet, which is not ready: the index may be empty.
    """
    names = list(checks)
    outcomes = await asyncio.gather(*(_run_check(n, checks[n], check_timeout_s) for n in names))
    results: dict[str, dict[str, object]] = dict(zip(names, outcomes, strict=True))
    if last_sync_age is not None and max_sync_age_s is not None:
        results["sync"] = _sync_result(last_sync_age(), max_sync_age_s)
    failed = tuple(n for n, r in results.items() if not r["ok"])
    body: dict[str, object] = {"ready": not failed, "checks": results}
    if failed:
        body["failed"] = list(failed)
    return Readiness(ready=not failed, failed=failed, body=body)


MAX_LOOP_LAG_S = 5.0


async def loop_lag_s() -> float:
    """How long a callback queued now waits for the event loop (work queued ahead of it, blocking calls)."""
    loop = asyncio.get_running_loop()
    ran: asyncio.Future[float] = loop.create_future()
    queued = loop.time()


    def mark() -> None:
        if not ran.done():
            ran.set_result(loop.time())

    loop.call_soon(mark)
    return max(0.0, await ran - queued)


def add_health_routes(
    app: web.Application,
    *,
    checks: Mapping[str, Check],
    metrics: Metrics,
    last_sync_age: Callable[[], float | None] | None = None,
    max_sync_age_s: float | None = None,
    check_timeout_s: float = DEFAULT_CHECK_TIMEOUT_S,
) -> None:
    """Mount ``GET /healthz``, ``/livez``, ``/readyz`` and ``/metrics`` on an existing app (the HTTP
    transport's)."""

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def livez(_: web.Request) -> web.Response:
        """Liveness: the event loop answers, and a callback queued now runs within ``MAX_LOOP_LAG_S``."""
        lag = await loop_lag_s()
        ok = lag <= MAX_LOOP_LAG_S
        return web.json_response({"live": ok, "loop_lag_ms": round(lag * 1000, 1)}, status=200 if ok else 503)

    async def readyz(_: web.Request) -> web.Response:
        result = await evaluate_readiness(checks, last_sync_age=last_sync_age, max_sync_age_s=max_sync_age_s,
                                          check_timeout_s=check_timeout_s)
        if not result.ready:
            log.warning("not ready: %s", ", ".join(result.failed))
        return web.Response(text=json.dumps(result.body), status=200 if result.ready else 503,
                            content_type="application/json")

    async def metrics_view(_: web.Request) -> web.Response:
        return web.Response(body=metrics.render().encode("utf-8"), headers={"Content-Type": CONTENT_TYPE})

    app.router.add_get("/healthz", healthz)
    app.router.add_get("/livez", livez)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics_view)


class HealthServer:
    """A standalone aiohttp server for the health routes (Socket Mode has no HTTP server of its own)."""

    def __init__(
        self,
        port: int,
        checks: Mapping[str, Check],
        metrics: Metrics,
        last_sync_age: Callable[[], float | None] | None = None,
        max_sync_age_s: float | None = None,
        *,
        host: str = "0.0.0.0",
        check_timeout_s: float = DEFAULT_CHECK_TIMEOUT_S,
    ) -> None:
        self.host = host
        self._port = port
        self.app = web.Application()
        add_health_routes(self.app, checks=checks, metrics=metrics, last_sync_age=last_sync_age,
                          max_sync_age_s=max_sync_age_s, check_timeout_s=check_timeout_s)
        self._runner: web.AppRunner | None = None

    @property
    def port(self) -> int:
        """The bound port (useful with ``port=0`` in tests)."""
        return self._port

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        return f"http://{host}:{self._port}"

    async def start(self) -> None:
        runner = web.AppRunner(self.app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, self.host, self._port)
        await site.start()
        self._runner = runner
        if runner.addresses:
            self._port = int(runner.addresses[0][1])
        log.info("health endpoints on %s (/healthz, /readyz, /metrics)", self.url)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> HealthServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


def http_get_check(url: str, *, headers: Mapping[str, str] | None = None, timeout_s: float = 5.0) -> Check:
    """A readiness check that GETs ``url`` (e.g. the LLM endpoint's ``/models``) and wants a 2xx.

    Raises the ``pipeline.errors`` RemoteError subclass matching the failure, so ``/readyz`` shows its
    meaning. Pass revealed secrets in ``headers``; they are never echoed in the result.
    """

    async def check() -> None:
        try:
            async with (
                aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as session,
                session.get(url, headers=dict(headers or {})) as resp,
            ):
                status = resp.status
        except aiohttp.ClientConnectorError as exc:
            raise UnreachableError(f"cannot connect to {url}", service=url) from exc
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise TransientError(f"request to {url} failed: {type(exc).__name__}", service=url) from exc
        if status in (401, 403):
            raise AuthError(f"{url} rejected the credentials (HTTP {status})", service=url, status=status)
        if status == 404:
            raise NotFoundError(f"{url} not found (HTTP 404)", service=url, status=status)
        if status >= 500:
            raise TransientError(f"{url} answered HTTP {status}", service=url, status=status)
        if not 200 <= status < 300:
            raise RemoteError(f"{url} answered HTTP {status}", service=url, status=status)

    return check
