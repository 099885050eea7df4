"""`evident serve`: the Slack bot, health/metrics endpoints and the periodic Confluence sync."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time

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


async def serve_forever(settings: Settings) -> None:
    from bot.core.health import add_health_routes
    from bot.slack.transports import check_tokens, run_bot
    from pipeline.factory import build_engine
    from pipeline.runtime.metrics import Metrics

    check_tokens(settings)  # fail fast, before loading models
    metrics = Metrics()  # one registry: the engine counts into it, /metrics serves it
    engine = await build_engine(settings, metrics=metrics)
    checks = {}

    async def index_check() -> None:
        await engine.index.count()

    checks["index"] = index_check
    if engine.llm is not None and hasattr(engine.llm, "ping"):
        checks["llm"] = engine.llm.ping
    sync_loop = SyncLoop(settings, engine) if settings.confluence_url else None
    routes = functools.partial(
        add_health_routes, checks=checks, metrics=metrics,
        last_sync_age=sync_loop.age if sync_loop else None,
        max_sync_age_s=3 * settings.sync_interval_s if sync_loop else None,
    )
    task = asyncio.create_task(sync_loop.run()) if sync_loop else None
    try:
        await run_bot(settings, engine, routes=routes)
    finally:
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await engine.aclose()


@click.command()
@click.pass_context
@cli_errors
def serve(ctx: click.Context) -> None:
    """Run the Slack bot (Socket Mode by default) with periodic Confluence sync."""
    run(serve_forever(load_settings(ctx)))
