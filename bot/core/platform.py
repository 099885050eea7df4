"""The seam every chat platform implements, so `evident serve` composes whichever are configured.

A platform adapter (``bot.slack``, ``bot.teams``) is one package with a ``Platform`` class; the CLI's
registry (``evident.platforms``) names it once. Serve then runs them all the same way: routes on the shared
HTTP server (health and metrics live there too), start (credentials checked, connected or listening), a
readiness check, and on shutdown: stop accepting, drain what is in flight, close.
"""

from __future__ import annotations

from typing import Protocol

from aiohttp import web


class Platform(Protocol):
    name: str

    def mount(self, app: web.Application) -> None:
        """Add the routes that belong on the shared HTTP server (``EVIDENT_HTTP_PORT``), before it starts."""

    async def start(self) -> None:
        """Check credentials and start taking events (connect, or listen on a port of its own). Raises
        ``AuthError``/``ConfigError`` (one line naming the setting) when it cannot."""

    async def ready(self) -> None:
        """A readiness check: returns while the platform takes events, raises while it does not."""

    async def stop_accepting(self) -> None:
        """Take no new events (the platform redelivers what it sends meanwhile)."""

    async def drain(self, timeout_s: float) -> int:
        """Wait up to ``timeout_s`` for answers in flight; cancel (and tell) the rest. Returns how many."""

    async def close(self) -> None:
        """Release connections and listeners. Safe after a failed ``start``."""
