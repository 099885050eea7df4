"""`evident serve`'s lifecycle: one engine, the configured chat platforms, the shared HTTP server (health,
metrics, Slack's HTTP transport) and the periodic Confluence sync, until SIGINT/SIGTERM.

Start-up: the platforms' settings are checked (exit 2, one line) before any model loads; the engine is built
(an index or endpoint that cannot be reached yet is retried, a rejected key stops); every remote credential is
probed; the shared server listens on ``EVIDENT_HTTP_PORT``; each platform starts. Shutdown: every platform
stops taking events, answers in flight get ``EVIDENT_SHUTDOWN_TIMEOUT_S`` to finish (the rest are cancelled
and their threads told), then everything closes. A signal at any moment is honoured.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING

from aiohttp import web

from bot.core.health import Check, add_health_routes
from bot.core.lifecycle import Stopped, stop_on_signals, until_stopped
from bot.core.platform import Platform
from evident.platforms import Registration, configured
from evident.settings import Settings
from pipeline.errors import (
    AuthError,
    ConfigError,
    EvidentError,
    NotFoundError,
    RateLimitedError,
    RemoteError,
    TransientError,
    UnreachableError,
)
from pipeline.protocols import Index
from pipeline.runtime.loop_watch import LoopWatch, freeze_start_up
from pipeline.runtime.memory import anonymous_mib, trim_heap
from pipeline.runtime.metrics import Metrics
from pipeline.runtime.remote import UNLIMITED, CallOptions, RetryPolicy, call_with_retries

if TYPE_CHECKING:
    from pipeline.answer.engine import Engine
    from pipeline.ingest.page_work import PageWork

log = logging.getLogger("evident.serve")
Routes = Callable[[web.Application], None]
ENGINE_RETRY = RetryPolicy(max_retries=UNLIMITED, initial_s=1.0, max_s=60.0)  # until it comes up, or a stop


class SyncLoop:
    """Runs the Confluence sync every ``interval_s``; remembers when it last succeeded (for /readyz)."""

    def __init__(self, settings: Settings, engine: Engine) -> None:
        self.settings = settings
        self.engine = engine
        self.last_ok: float | None = None

    def age(self) -> float | None:
        return None if self.last_ok is None else time.monotonic() - self.last_ok

    async def run(self) -> None:
        """Sync cycles until cancelled; pages are prepared where ``EVIDENT_PAGE_PROCESS`` says (by default in
        a worker process at a lower CPU priority), by one worker kept for every cycle, and the keyword
        vocabulary's counts are kept in memory from one cycle to the next."""
        from pipeline.ingest.page_work import make_page_work

        work = make_page_work(self.settings.ingest, self.engine.sparse, serving=True)
        try:
            await self._cycles(work)
        finally:
            await work.close()

    async def _cycles(self, work: PageWork) -> None:
        from connectors.confluence.run import run_sync, summary
        from pipeline.ingest.vocabulary_run import KeptCounts

        kept = KeptCounts()  # the keyword vocabulary's counts, from one cycle to the next
        while True:
            try:
                report = await run_sync(
                    self.settings, spaces=None, full=False, progress=False, engine=self.engine, work=work,
                    kept=kept,
                )
                log.info("sync: %s", summary(report))
                for label, rows in (("failed", report.failed), ("partial", report.partial)):
                    for where, reason in rows[:50]:
                        log.warning("sync %s: %s: %s", label, where, reason)
                if not report.failed:
                    self.last_ok = time.monotonic()
            except EvidentError as exc:
                log.error("sync failed: %s", exc)
            except Exception:  # a bug in one cycle must not end the sync loop for the process's lifetime
                log.exception("sync failed unexpectedly; the next cycle runs as usual")
            await asyncio.to_thread(_trimmed)  # the cycle's peak, left in its threads' malloc arenas
            await asyncio.sleep(self.settings.serve.sync_interval_s)


def _trimmed() -> None:
    if not log.isEnabledFor(logging.DEBUG):
        trim_heap()
        return
    before, t = anonymous_mib(), time.perf_counter()
    if trim_heap():
        log.debug("sync: anonymous memory %s -> %s MiB, the heap trimmed in %.1f ms", before, anonymous_mib(),
                  (time.perf_counter() - t) * 1000)


async def serve_forever(
    settings: Settings, *, stop: asyncio.Event | None = None, host: str = "0.0.0.0"
) -> None:
    """Serve the configured platforms from one process and one engine until SIGINT/SIGTERM (or ``stop``)."""
    chosen = configured(settings)  # fail fast, before loading models
    stop = stop or asyncio.Event()
    metrics = Metrics()  # one registry: the engine counts into it, /metrics serves it
    with stop_on_signals(stop):
        async with _loop_watch(settings, metrics):
            try:
                engine = await start_engine(settings, metrics, stop)
            except Stopped:
                log.info("stopped during start-up")
                return
            # every wake-up of the loop waits for the GIL while a sync thread parses: up to one interval each
            sys.setswitchinterval(settings.serve.switch_interval_ms / 1000)
            log.info("start-up: %d objects left out of garbage collection; the GIL switches every %g ms",
                     freeze_start_up(), settings.serve.switch_interval_ms)
            try:
                await _serve_engine(settings, engine, chosen, stop, metrics, host)
            finally:
                await engine.aclose()


def _loop_watch(settings: Settings, metrics: Metrics) -> contextlib.AbstractAsyncContextManager[object]:
    """Warnings naming where the event loop was blocked, counted (``EVIDENT_LOOP_WATCH_MS``; 0: none)."""
    ms = settings.serve.loop_watch_ms
    if not ms:
        return contextlib.nullcontext()
    return LoopWatch(ms / 1000, on_block=metrics.loop_blocks.inc).watching()


async def _serve_engine(settings: Settings, engine: Engine, chosen: Sequence[Registration],
                        stop: asyncio.Event, metrics: Metrics, host: str) -> None:
    """The platforms, the HTTP server and the sync loop around a started engine, until ``stop``."""
    platforms = [r.build(settings, engine, metrics) for r in chosen]
    sync_loop = SyncLoop(settings, engine) if settings.confluence.url else None
    checks = engine_checks(engine)
    routes = functools.partial(
        add_health_routes, checks=checks, metrics=metrics,
        last_sync_age=sync_loop.age if sync_loop else None,
        max_sync_age_s=3 * settings.serve.sync_interval_s if sync_loop else None)
    task = asyncio.create_task(sync_loop.run()) if sync_loop else None
    try:
        await serve_platforms(
            platforms,
            stop,
            port=settings.serve.http_port,
            host=host,
            routes=routes,
            checks=checks,
            drain_timeout_s=settings.chat.shutdown_timeout_s,
        )
    finally:
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def start_engine(settings: Settings, metrics: Metrics, stop: asyncio.Event) -> Engine:
    """Build the engine and check every credential, raced against ``stop`` (``Stopped`` when it wins).

    A rejected credential raises at once (exit 2, one line); an index or embeddings endpoint that cannot be
    reached yet (connection refused, timeout, 5xx) is retried with backoff up to a minute apart, and the
    process is not ready meanwhile (no health endpoint answers before the engine exists).
    """
    from pipeline.factory import build_engine

    def retry(exc: BaseException) -> bool:
        return isinstance(exc, UnreachableError | TransientError | RateLimitedError)

    async def build() -> Engine:
        return await build_engine(settings, metrics=metrics, serving=True)

    engine = await until_stopped(
        call_with_retries(
            build, ENGINE_RETRY, CallOptions(log, "not ready: opening the index and models", retry=retry)
        ),
        stop,
        what="loading models",
    )
    try:
        await until_stopped(probe_credentials(settings, engine), stop, what="checking credentials")
    except BaseException:
        await engine.aclose()
        raise
    await warn_unpermitted(settings, engine.index)
    return engine


async def warn_unpermitted(settings: Settings, index: Index) -> int:
    """Per-user access: say how much indexed evidence carries no permissions yet (shown to nobody until a sync
    writes them). Returns that count."""
    if settings.access.mode != "per-user":
        return 0
    missing = await index.missing_access()
    if missing:
        log.warning("EVIDENT_ACCESS=per-user: %d indexed evidence carry no permissions yet and are shown to "
                    "nobody; the next sync (`evident sync`, or serve's own) writes them", missing)
    return missing


async def probe_credentials(settings: Settings, engine: Engine) -> None:
    """One call per remote credential before serving: a rejected key, token or model stops start-up (exit 2,
    one line naming the setting); an unreachable service only warns, and shows as not ready meanwhile."""
    from connectors.factory import make_confluence_source

    probes: list[tuple[str, Callable[[], Awaitable[object]]]] = []
    if engine.llm is not None:
        probes.append(("EVIDENT_LLM_BASE_URL / EVIDENT_LLM_API_KEY / EVIDENT_LLM_MODEL", engine.llm.ping))
    confluence = settings.confluence
    source = make_confluence_source(settings) if confluence.url and confluence.spaces else None
    if source is not None:
        probes.append(("CONFLUENCE_URL / CONFLUENCE_TOKEN / CONFLUENCE_SPACES",
                       functools.partial(source.check_space, confluence.spaces[0])))
    try:
        for names, probe in probes:
            try:
                await probe()
            except (AuthError, NotFoundError) as exc:
                raise type(exc)(f"{exc} (check {names})", service=exc.service, status=exc.status) from None
            except RemoteError as exc:
                log.warning("cannot check %s yet: %s", names, exc)
    finally:
        if source is not None:
            source.close()


def engine_checks(engine: Engine) -> dict[str, Check]:
    """The engine's readiness checks: its index, and its LLM endpoint where one is configured."""
    checks: dict[str, Check] = {"index": engine.index.ready}
    if engine.llm is not None:
        checks["llm"] = engine.llm.ping
    return checks


async def serve_platforms(
    platforms: Sequence[Platform],
    stop: asyncio.Event,
    *,
    port: int,
    host: str = "0.0.0.0",
    routes: Routes | None = None,
    checks: dict[str, Check] | None = None,
    drain_timeout_s: float = 30.0,
    started: Callable[[int], None] | None = None,
) -> None:
    """Run ``platforms`` and the shared HTTP server on ``port`` (``routes``: health and metrics) until
    ``stop``; then stop accepting everywhere, drain for ``drain_timeout_s`` and close. ``started`` gets the
    bound port."""
    web_app = web.Application()
    if routes is not None:
        routes(web_app)
    for p in platforms:
        p.mount(web_app)
    runner = web.AppRunner(web_app, handle_signals=False, access_log=None)
    await runner.setup()
    try:
        try:
            await web.TCPSite(runner, host, port).start()
        except OSError as exc:
            raise ConfigError(
                f"cannot listen on {host}:{port} (EVIDENT_HTTP_PORT): {exc.strerror or exc}"
            ) from None
        if started is not None:
            started(int(runner.addresses[0][1]) if runner.addresses else port)
        for p in platforms:
            if checks is not None:
                checks[p.name] = p.ready  # not ready until started
        with contextlib.suppress(Stopped):
            for p in platforms:
                await until_stopped(p.start(), stop, what=f"starting {p.name}")
            await stop.wait()
    finally:
        await _shut_down(platforms, drain_timeout_s)
        await runner.cleanup()


async def _shut_down(platforms: Sequence[Platform], drain_timeout_s: float) -> None:
    for p in platforms:
        try:
            await p.stop_accepting()
        except Exception:  # one platform's failure must not keep the others' answers from draining
            log.exception("%s: could not stop accepting", p.name)
    cancelled = await asyncio.gather(*(p.drain(drain_timeout_s) for p in platforms), return_exceptions=True)
    for p, n in zip(platforms, cancelled, strict=True):
        if isinstance(n, int) and n:
            log.warning("%s: cancelled %d answer(s) still running after %.0f s", p.name, n, drain_timeout_s)
    for p in platforms:
        try:
            await p.close()
        except Exception:
            log.exception("%s: could not close", p.name)
