"""A local OpenAI-compatible chat-completions server for tests (real HTTP, real wire format).

Usage::

    async with StubLLMServer(responder=lambda req: "Paris [Source 1]") as stub:
        llm = OpenAILLM(base_url=stub.base_url, api_key="k", models={"answer": "m"})
        ...
        stub.requests[-1]["messages"]   # what the client sent

``POST /v1/completions`` answers the legacy wire format with ``echo`` + ``logprobs`` the way vLLM and
llama.cpp do: whitespace-led word tokens with character ``text_offset``s, the first token's log-prob
``null``. A token scores ``copy_logprob`` when the same word already occurred earlier in the text (a
model that copies from its context) and ``novel_logprob`` otherwise; ``echo_logprobs=False`` imitates
a server that ignores ``echo``; ``hide_special_tokens=True`` imitates llama.cpp, whose offsets count
the detokenized text, in which ``<|im_start|>``-style special tokens are empty.

Replies come from ``responder(request_json) -> str | list[str]`` (a list gives the choices for ``n``),
else from the ``replies`` queue (one per choice), else ``default_reply``. Failures are injected with
``fail_next("429" | "500" | "400" | "hang", count, retry_after=...)``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import random
import re
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any, Literal

from aiohttp import web

Responder = Callable[[dict[str, Any]], "str | list[str]"]
FailureKind = Literal["429", "500", "400", "hang"]


def _error(status: int, message: str, *, type_: str, code: str | None = None, param: str | None = None,
           headers: dict[str, str] | None = None) -> web.Response:
    body = {"error": {"message": message, "type": type_, "param": param, "code": code}}
    return web.json_response(body, status=status, headers=headers)


class StubLLMServer:
    """aiohttp server on 127.0.0.1 with a random port; ``base_url`` ends in ``/v1`` like OpenAI's."""

    def __init__(
        self,
        *,
        responder: Responder | None = None,
        replies: Iterable[str] = (),
        default_reply: str = "stub reply",
        latency: float | tuple[float, float] = 0.0,
        require_key: str | None = None,
        unknown_models: Iterable[str] = (),
        models: Iterable[str] = ("stub-model",),
        supports_n: bool = True,
        max_choices: int | None = None,
        hang_s: float = 60.0,
        seed: int = 0,
        copy_logprob: float = -0.1,
        novel_logprob: float = -5.0,
        echo_logprobs: bool = True,
        hide_special_tokens: bool = False,
        stream_delay: float = 0.0,
        port: int = 0,
    ) -> None:
        self.port = port  # 0: any free one
        self.responder = responder
        self.replies: deque[str] = deque(replies)
        self.default_reply = default_reply
        self.latency = latency
        self.require_key = require_key
        self.unknown_models = set(unknown_models)
        self.models = list(models)
        self.supports_n = supports_n
        self.max_choices = max_choices
        self.hang_s = hang_s
        self.copy_logprob = copy_logprob
        self.novel_logprob = novel_logprob
        self.echo_logprobs = echo_logprobs
        self.hide_special_tokens = hide_special_tokens
        self.stream_delay = stream_delay  # seconds between streamed words
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.calls = 0
        self._failures: deque[tuple[str, float]] = deque()
        self._rng = random.Random(seed)
        self._ids = itertools.count(1)
        self._closing = asyncio.Event()
        self._runner: web.AppRunner | None = None

    # ------------------------------------------------------------ control

    def fail_next(self, kind: FailureKind, count: int = 1, *, retry_after: float = 1.0) -> None:
        """Make the next ``count`` completion calls fail: 429 with Retry-After, 500, 400 (context too long),
        or hang past the client's timeout."""
        self._failures.extend((kind, retry_after) for _ in range(count))

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    # ------------------------------------------------------------ lifecycle

    async def start(self) -> StubLLMServer:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._completions)
        app.router.add_post("/v1/completions", self._text_completions)
        app.router.add_get("/v1/models", self._models)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self.port)
        await site.start()
        server = site._server
        assert server is not None
        self.port = server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]
        return self

    async def close(self) -> None:
        self._closing.set()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> StubLLMServer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ------------------------------------------------------------ handlers

    def _auth_error(self, request: web.Request) -> web.Response | None:
        if self.require_key is None:
            return None
        if request.headers.get("Authorization") != f"Bearer {self.require_key}":
            return _error(
                401, "Incorrect API key provided.", type_="invalid_request_error", code="invalid_api_key"
            )
        return None

    async def _models(self, request: web.Request) -> web.Response:
        if (err := self._auth_error(request)) is not None:
            return err
        data = [{"id": m, "object": "model", "created": 0, "owned_by": "stub"} for m in self.models]
        return web.json_response({"object": "list", "data": data})

    async def _completions(self, request: web.Request) -> web.Response:
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            return await self._complete(request)
        finally:
            self.in_flight -= 1

    async def _complete(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.calls += 1
        self.requests.append(body)
        self.headers.append(dict(request.headers))
        if (err := self._auth_error(request)) is not None:
            return err
        model = body.get("model", "")
        if model in self.unknown_models:
            return _error(404, f"The model `{model}` does not exist or you do not have access to it.",
                          type_="invalid_request_error", code="model_not_found")
        await self._sleep_latency()
        if (failure := await self._injected_failure()) is not None:
            return failure
        n = int(body.get("n") or 1)
        if n > 1 and not self.supports_n:
            return _error(
                400, "Only n=1 is supported for this model.", type_="invalid_request_error", param="n"
            )
        texts = self._texts(body, n)
        if body.get("stream"):
            return await self._stream(request, model, texts[0])
        choices = [
            {
                "index": i,
                "message": {"role": "assistant", "content": t},
                "logprobs": None,
                "finish_reason": "stop",
            }
            for i, t in enumerate(texts)
        ]
        prompt_tokens = sum(len(str(m.get("content", "")).split()) for m in body.get("messages", []))
        completion_tokens = sum(len(t.split()) for t in texts)
        return web.json_response({
            "id": f"chatcmpl-stub{next(self._ids)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "choices": choices,
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens},
        })

    async def _stream(self, request: web.Request, model: str, text: str) -> web.StreamResponse:
        """Server-sent events the way OpenAI streams: one chunk per word (``stream_delay`` apart), [DONE]."""
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        cid = f"chatcmpl-stub{next(self._ids)}"
        words = re.findall(r"\S+\s*", text) or [""]
        for i, word in enumerate(words):
            delta = {"role": "assistant", "content": word} if i == 0 else {"content": word}
            chunk = {
                "id": cid,
                "object": "chat.completion.chunk",
                "created": int(time.time()),
                "model": model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": None}],
            }
            await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
            if self.stream_delay:
                await asyncio.sleep(self.stream_delay)
        done = {"id": cid, "object": "chat.completion.chunk", "created": int(time.time()), "model": model,
                "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
        await resp.write(f"data: {json.dumps(done)}\n\ndata: [DONE]\n\n".encode())
        await resp.write_eof()
        return resp

    async def _injected_failure(self) -> web.Response | None:
        """The next queued ``fail_next`` failure, if any (shared by both completion endpoints)."""
        if not self._failures:
            return None
        kind, retry_after = self._failures.popleft()
        if kind == "429":
            return _error(429, "Rate limit reached.", type_="requests", code="rate_limit_exceeded",
                          headers={"Retry-After": f"{retry_after:g}"})
        if kind == "400":
            return _error(400, "This model's maximum context length is 8192 tokens.",
                          type_="invalid_request_error", param="messages", code="context_length_exceeded")
        if kind == "500":
            return _error(500, "The server had an error while processing your request.", type_="server_error")
        with contextlib.suppress(TimeoutError):  # hang until the client gives up or the server closes
            await asyncio.wait_for(self._closing.wait(), self.hang_s)
        return _error(500, "hung request released", type_="server_error")

    async def _text_completions(self, request: web.Request) -> web.Response:
        """Legacy completions: one generated token, plus the prompt's token log-probs when echoed."""
        body = await request.json()
        self.calls += 1
        self.requests.append(body)
        if (err := self._auth_error(request)) is not None:
            return err
        await self._sleep_latency()
        if (failure := await self._injected_failure()) is not None:
            return failure
        prompt = str(body.get("prompt", ""))
        generated = " ok"
        logprobs: dict[str, Any] | None = None
        if body.get("logprobs") is not None:
            text = prompt + generated if body.get("echo") and self.echo_logprobs else generated
            base = 0 if body.get("echo") and self.echo_logprobs else len(prompt)
            tokens, offsets, values = [], [], []
            seen: set[str] = set()
            if self.hide_special_tokens:
                text = re.sub(r"<\|[\w.-]+\|>", "", text)
            for i, match in enumerate(re.finditer(r"<\|[\w.-]+\|>|\s*(?:(?!<\|)\S)+|\s+", text)):
                word = match.group().strip().lower().strip(".,:;?!()[]")
                tokens.append(match.group())
                offsets.append(base + match.start())
                values.append(None if i == 0 and base == 0 else
                              self.copy_logprob if word in seen else self.novel_logprob)
                seen.add(word)
            logprobs = {
                "tokens": tokens,
                "text_offset": offsets,
                "token_logprobs": values,
                "top_logprobs": [None if v is None else {t: v} for t, v in zip(tokens, values, strict=True)],
            }
        return web.json_response({
            "id": f"cmpl-stub{next(self._ids)}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": body.get("model", ""),
            "choices": [{"index": 0, "text": (prompt if body.get("echo") else "") + generated,
                         "logprobs": logprobs, "finish_reason": "length"}],
            "usage": {"prompt_tokens": len(prompt.split()), "completion_tokens": 1,
                      "total_tokens": len(prompt.split()) + 1},
        })

    async def _sleep_latency(self) -> None:
        if isinstance(self.latency, tuple):
            mean, jitter = self.latency
            delay = max(0.0, mean + self._rng.uniform(-jitter, jitter))
        else:
            delay = self.latency
        if delay > 0:
            await asyncio.sleep(delay)

    def _texts(self, body: dict[str, Any], n: int) -> list[str]:
        if self.max_choices is not None:
            n = min(n, self.max_choices)
        if self.responder is not None:
            out = self.responder(body)
            return [out] * n if isinstance(out, str) else list(out)[:n]
        return [self.replies.popleft() if self.replies else self.default_reply for _ in range(n)]
