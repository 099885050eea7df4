"""A measuring harness: a caching proxy in front of an OpenAI-compatible LLM server, so that A/B runs of
explanation scoring pay only for the generations that differ.

    python benchmarks/llm_cache.py --upstream http://127.0.0.1:8765 --port 8764 --db /tmp/llm/cache.sqlite
    EVIDENT_LLM_BASE_URL=http://127.0.0.1:8764/v1 evident eval attribution ...

Why it exists: with Qwen2.5-0.5B on 2 CPU cores, 24 questions of ``evident eval attribution`` take ~25
minutes, nearly all of it regenerations. Two runs that differ only in how shares are ordered send mostly the
same requests; with greedy decoding (``temperature`` 0, which the explanations and the faithfulness
regenerations use) the same request gets the same reply, so a second run replays the first one's replies and
generates only the new ones. Only non-streamed ``/v1/chat/completions`` and ``/v1/completions`` requests with
``temperature`` 0 are cached (keyed by the upstream's URL and the request body's canonical JSON: llama.cpp
ignores the body's ``model``, so keep one ``--db`` per model file); anything else is forwarded as it is.
Not part of evident: a measurement that goes through it says so.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sqlite3
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

CACHED_PATHS = ("/v1/chat/completions", "/v1/completions")


def cache_key(upstream: str, path: str, body: dict[str, Any]) -> str | None:
    """The key of a cacheable request, or None (streamed, sampled, or another endpoint)."""
    if path not in CACHED_PATHS or body.get("stream") or float(body.get("temperature", 1.0)) != 0.0:
        return None
    canonical = json.dumps([upstream, path, body], sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


class Cache:
    """Replies by key, in SQLite (one writer: this process)."""

    def __init__(self, path: Path) -> None:
        self.db = sqlite3.connect(path)
        self.db.execute("CREATE TABLE IF NOT EXISTS replies (key TEXT PRIMARY KEY, reply BLOB NOT NULL)")
        self.hits = self.misses = 0

    def get(self, key: str) -> bytes | None:
        row = self.db.execute("SELECT reply FROM replies WHERE key = ?", (key,)).fetchone()
        return bytes(row[0]) if row else None

    def put(self, key: str, reply: bytes) -> None:
        self.db.execute("INSERT OR REPLACE INTO replies VALUES (?, ?)", (key, reply))
        self.db.commit()


def make_app(upstream: str, cache: Cache) -> web.Application:
    async def forward(request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        key = None
        if request.method == "POST":
            try:
                key = cache_key(upstream, request.path, json.loads(raw))
            except (ValueError, TypeError, AttributeError):
                key = None
        if key is not None and (found := cache.get(key)) is not None:
            cache.hits += 1
            return web.Response(body=found, content_type="application/json")
        session: aiohttp.ClientSession = request.app["session"]
        headers = {k: v for k, v in request.headers.items() if k.lower() in ("content-type", "authorization")}
        async with session.request(request.method, upstream + request.path_qs, data=raw,
                                   headers=headers) as up:
            body = await up.read()
            if key is not None and up.status == 200:
                cache.misses += 1
                cache.put(key, body)
            return web.Response(body=body, status=up.status,
                                content_type=up.content_type or "application/json")

    async def stats(request: web.Request) -> web.Response:
        return web.json_response({"hits": cache.hits, "misses": cache.misses})

    async def start(app: web.Application) -> None:
        app["session"] = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None))

    async def stop(app: web.Application) -> None:
        await app["session"].close()

    app = web.Application(client_max_size=64 * 2**20)
    app.on_startup.append(start)
    app.on_cleanup.append(stop)
    app.router.add_get("/cache-stats", stats)
    app.router.add_route("*", "/{tail:.*}", forward)
    return app


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--upstream", default="http://127.0.0.1:8765")
    ap.add_argument("--port", type=int, default=8764)
    ap.add_argument("--db", type=Path, required=True)
    a = ap.parse_args()
    web.run_app(make_app(a.upstream.rstrip("/"), Cache(a.db)), host="127.0.0.1", port=a.port)


if __name__ == "__main__":
    main()
