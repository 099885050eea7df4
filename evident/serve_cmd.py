"""`evident serve`: the Slack bot, health/metrics endpoints and the periodic Confluence sync."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from typing import Any

import click

from evident.common import cli_errors, load_settings, run
from pipeline.runtime.settings import Settings

log = logging.getLogger("evident.serve")


class SyncLoop:
    """Runs the Confluence sync every ``interval_s``; remembers when it last succeeded (for /readyz)."""

    def __init__(self, settings: Settings, engine) -> None:  # type: ignore[no-untyped-def]
        self.settings = settings
        self.engine = engine
        self.last_ok: float | None = None

    def age(self) -> float | None:
        return None if self.last_ok is None else time.monotonic() - self.last_ok

    async def run(self) -> None:
        from connectors.confluence.run import run_sync, summary
        from pipeline.errors import EvidentError

        while True:
            try:
                report = await run_sync(self.settings, spaces=None, full=False, progress=False, engine=self.engine)
                log.info("sync: %s", summary(report))
                for label, rows in (("failed", report.failed), ("partial", report.partial)):
                    for where, reason in rows[:50]:
                        log.warning("sync %s: %s: %s", label, where, reason)
                if not report.failed:
                    self.last_ok = time.monotonic()
            except EvidentError as exc:
                log.error("sync failed: %s", exc)
            await asyncio.sleep(self.settings.sync_interval_s)


def platforms(settings: Settings) -> tuple[str, ...]:
    """The chat platforms the settings configure: Slack (SLACK_BOT_TOKEN), Teams (TEAMS_APP_ID), or both."""
    from pipeline.errors import ConfigError

    found = tuple(name for name, on in (("slack", bool(settings.slack_bot_token.reveal())),
                                        ("teams", bool(settings.teams_app_id))) if on)
    if not found:
        raise ConfigError("nothing to serve: set SLACK_BOT_TOKEN (Slack) and/or TEAMS_APP_ID (Teams)")
    return found


async def serve_forever(settings: Settings, *, stop: asyncio.Event | None = None) -> None:
    """Serve the configured platforms from one process and one engine until SIGINT/SIGTERM (or ``stop``).

    The signals are honoured from the first moment: a stop during model loading, the credential checks or a
    wait for an unreachable index ends start-up cleanly (nothing has been written yet) and returns.
    """
    from bot.core.lifecycle import Stopped, stop_on_signals
    from bot.slack.transports import check_tokens
    from bot.teams.app import check_teams_settings
    from pipeline.runtime.metrics import Metrics

    chosen = platforms(settings)
    if "slack" in chosen:
        check_tokens(settings)  # fail fast, before loading models
    if "teams" in chosen:
        check_teams_settings(settings)
    stop = stop or asyncio.Event()
    metrics = Metrics()  # one registry: the engine counts into it, /metrics serves it
    with stop_on_signals(stop):
        try:
            engine = await start_engine(settings, metrics, stop)
        except Stopped:
            log.info("stopped during start-up")
            return
        try:
            await _serve_with(settings, engine, metrics, chosen, stop)
        finally:
            await engine.aclose()


async def start_engine(settings: Settings, metrics: Any, stop: asyncio.Event) -> Any:
    """Build the engine and check every credential, raced against ``stop`` (``Stopped`` when it wins).

    A rejected credential raises at once (exit 2, one line); an index or embeddings endpoint that cannot be
    reached yet (connection refused, timeout, 5xx) is retried with backoff up to a minute apart, and the
    process is not ready meanwhile (no health endpoint answers before the engine exists).
    """
    from bot.core.lifecycle import Stopped, sleep_or_stop, until_stopped
    from pipeline.errors import RateLimitedError, TransientError, UnreachableError
    from pipeline.factory import build_engine

    delay = 1.0
    while True:
        try:
            engine = await until_stopped(build_engine(settings, metrics=metrics, serving=True), stop, what="loading models")
            break
        except (UnreachableError, TransientError, RateLimitedError) as exc:
            log.warning("not ready: %s; retrying in %.0f s", exc, delay)
        if await sleep_or_stop(delay, stop):
            raise Stopped("waiting for the index")
        delay = min(delay * 2, 60.0)
    try:
        await until_stopped(probe_credentials(settings, engine), stop, what="checking credentials")
    except BaseException:
        await engine.aclose()
        raise
    return engine


async def _serve_with(settings: Settings, engine: Any, metrics: Any, chosen: tuple[str, ...],
                      stop: asyncio.Event) -> None:
    sync_loop = SyncLoop(settings, engine) if settings.confluence_url else None
    checks: dict[str, Any] = {}  # the platforms add theirs ("slack": the Socket Mode link, "teams": listening)
    routes = _health_routes(settings, engine, metrics, sync_loop, checks)
    task = asyncio.create_task(sync_loop.run()) if sync_loop else None
    try:
        await _run_platforms(settings, engine, chosen, stop, routes, checks, metrics)
    finally:
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def probe_credentials(settings: Settings, engine: Any) -> None:
    """One call per remote credential before serving: a rejected key, token or model stops start-up (exit 2,
    one line naming the setting); an unreachable service only warns, and shows as not ready meanwhile."""
    from connectors.factory import make_confluence_source
    from pipeline.errors import AuthError, NotFoundError, RemoteError

    probes: list[tuple[str, Any]] = []
    if engine.llm is not None:
        probes.append(("EVIDENT_LLM_BASE_URL / EVIDENT_LLM_API_KEY / EVIDENT_LLM_MODEL", engine.llm.ping))
    source = make_confluence_source(settings) if settings.confluence_url and settings.confluence_spaces else None
    if source is not None:
        probes.append(("CONFLUENCE_URL / CONFLUENCE_TOKEN / CONFLUENCE_SPACES",
                       functools.partial(source.check_space, settings.confluence_spaces[0])))
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


def _health_routes(settings: Settings, engine: Any, metrics: Any, sync_loop: SyncLoop | None,
                   checks: dict[str, Any]) -> Any:
    from bot.core.health import add_health_routes
    from pipeline.index.edge_worker import index_ready

    checks["index"] = functools.partial(index_ready, engine.index)
    if engine.llm is not None and hasattr(engine.llm, "ping"):
        checks["llm"] = engine.llm.ping
    return functools.partial(
        add_health_routes, checks=checks, metrics=metrics,
        last_sync_age=sync_loop.age if sync_loop else None,
        max_sync_age_s=3 * settings.sync_interval_s if sync_loop else None,
    )


async def _run_platforms(settings: Settings, engine: Any, chosen: tuple[str, ...], stop: asyncio.Event,
                         routes: Any, checks: dict[str, Any], metrics: Any) -> None:
    """Each platform until ``stop``; health routes go with Slack's HTTP port, or with Teams' when alone. One
    platform failing stops the others."""
    from bot.slack.transports import run_bot
    from bot.teams.app import run_teams

    runs = []
    if "slack" in chosen:
        runs.append(run_bot(settings, engine, stop=stop, routes=routes, checks=checks, metrics=metrics))
    if "teams" in chosen:
        runs.append(run_teams(settings, engine, stop, routes=None if "slack" in chosen else routes, checks=checks,
                              metrics=metrics))
    tasks = [asyncio.create_task(r) for r in runs]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        for t in done:
            if t.exception() is not None:
                stop.set()
    finally:
        stop.set()
        results = await asyncio.gather(*tasks, return_exceptions=True)
    for r in results:
        if isinstance(r, BaseException):
            raise r


@click.command()
@click.pass_context
@cli_errors
def serve(ctx: click.Context) -> None:
    """Run the Slack and/or Teams bot (whichever is configured) with periodic Confluence sync."""
    run(serve_forever(load_settings(ctx)))
