"""An aiohttp application served on 127.0.0.1 from its own thread and event loop.

For fakes that synchronous code calls (``CliRunner`` commands, the synchronous ``Embedder`` protocol):
those block the test's loop, so the fake cannot live on it.
"""

from __future__ import annotations

import asyncio
import threading

from aiohttp import web


class ThreadedServer:
    """``with ThreadedServer(app) as server: server.url`` ("127.0.0.1:PORT"); shut down cleanly on exit."""

    def __init__(self, app: web.Application) -> None:
        self.app = app
        self.url = ""
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._runner: web.AppRunner | None = None

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)

        async def start() -> None:
            runner = web.AppRunner(self.app, access_log=None)
            self._runner = runner
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
            self.url = f"127.0.0.1:{port}"
            self._ready.set()

        self._loop.run_until_complete(start())
        try:
            self._loop.run_forever()
        finally:
            self._loop.close()

    def __enter__(self) -> ThreadedServer:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("test server did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
