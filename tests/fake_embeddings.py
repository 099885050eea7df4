"""A local OpenAI-compatible ``/v1/embeddings`` server (the wire format of OpenAI, TEI, vLLM, Ollama).

Runs in its own thread with its own event loop, so synchronous clients (the ``Embedder`` protocol)
can call it from tests. Vectors are deterministic per input text (hash-seeded), so two calls with the
same text agree. Knobs: ``require_key``, ``models``, ``dim``, ``latency_s``, ``max_inputs`` (TEI's
``max_client_batch_size``: more inputs -> 413), ``fail_next(status, count, retry_after)``.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections import deque
from typing import Any

import numpy as np
from aiohttp import web
from thread_server import ThreadedServer


class FakeEmbeddingsServer:
    def __init__(
        self,
        *,
        dim: int = 64,
        models: tuple[str, ...] = ("fake-embed",),
        require_key: str | None = None,
        latency_s: float = 0.0,
        max_inputs: int | None = None,
        honour_dimensions: bool = True,
    ) -> None:
        self.dim, self.models, self.require_key = dim, models, require_key
        self.honour_dimensions = honour_dimensions
        self.latency_s, self.max_inputs = latency_s, max_inputs
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.max_in_flight = 0
        self._in_flight = 0
        self._failures: deque[tuple[int, float | None]] = deque()
        self.base_url = ""

    def fail_next(self, status: int, count: int = 1, *, retry_after: float | None = None) -> None:
        self._failures.extend((status, retry_after) for _ in range(count))

    @staticmethod
    def vector(text: str, dim: int) -> np.ndarray:
        seed = int.from_bytes(hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()[:8], "little")
        v = np.random.default_rng(seed).standard_normal(dim).astype(np.float32)
        return v / np.linalg.norm(v)

    async def _embeddings(self, request: web.Request) -> web.Response:
        self._in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self._in_flight)
        try:
            body = await request.json()
            self.requests.append(body)
            self.headers.append(dict(request.headers))
            if self.latency_s:
                await asyncio.sleep(self.latency_s)
            if self.require_key and request.headers.get("Authorization") != f"Bearer {self.require_key}" \
                    and request.headers.get("api-key") != self.require_key:
                return _error(401, "Incorrect API key provided.", "invalid_api_key")
            if self._failures:
                status, retry_after = self._failures.popleft()
                headers = {"Retry-After": str(retry_after)} if retry_after is not None else {}
                return _error(
                    status, "Rate limit reached." if status == 429 else "upstream failed", None, headers
                )
            if body.get("model") not in self.models:
                return _error(404, f"The model `{body.get('model')}` does not exist", "model_not_found")
            inputs = body.get("input")
            inputs = [inputs] if isinstance(inputs, str) else inputs
            if self.max_inputs is not None and len(inputs) > self.max_inputs:
                return _error(
                    413, f"batch size {len(inputs)} > maximum allowed batch size {self.max_inputs}", None
                )
            dim = int(body.get("dimensions") or self.dim) if self.honour_dimensions else self.dim
            data = [{"object": "embedding", "index": i, "embedding": self.vector(t, dim).tolist()}
                    for i, t in enumerate(inputs)]
            data.reverse()  # servers need not answer in order: the client sorts by index
            return web.json_response({"object": "list", "data": data, "model": body["model"],
                                      "usage": {"prompt_tokens": 0, "total_tokens": 0}})
        finally:
            self._in_flight -= 1

    def __enter__(self) -> FakeEmbeddingsServer:
        app = web.Application(client_max_size=64 * 2**20)
        app.router.add_post("/v1/embeddings", self._embeddings)
        self._server = ThreadedServer(app).__enter__()
        self.base_url = f"http://{self._server.url}/v1"
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.__exit__(*exc)


def _error(
    status: int, message: str, code: str | None, headers: dict[str, str] | None = None
) -> web.Response:
    return web.json_response({"error": {"message": message, "type": "invalid_request_error", "code": code}},
                             status=status, headers=headers or {})
