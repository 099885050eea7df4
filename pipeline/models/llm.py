"""An OpenAI-compatible chat-completions client with our own retries, a concurrency cap and clear errors.

The SDK's built-in retries are switched off (``max_retries=0``) so the shared remote-call helper
(``pipeline.runtime.remote``) decides what is retried (429 and 5xx honouring ``Retry-After``, timeouts,
connection errors), how long to wait and what the caller finally sees (an exception from
``pipeline.errors``). One
``asyncio.Semaphore`` per instance bounds in-flight requests across every caller, so attribution's many
counterfactual calls cannot flood a small local server.
"""

from __future__ import annotations

import asyncio
import logging
import re
import socket
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar

import openai

from pipeline.errors import (
    ConfigError,
    NotFoundError,
    RemoteError,
    TransientError,
    UnreachableError,
)
from pipeline.models.chat_tokens import neutralize_special_tokens
from pipeline.runtime.remote import CallOptions, RetryPolicy, call_with_retries, status_error
from pipeline.types import ChatMessage

log = logging.getLogger(__name__)

SERVICE = "llm"
T = TypeVar("T")
_N_PARAM = re.compile(r"(?<![\w'])n(?![\w'])|'n'|\"n\"|`n`", re.IGNORECASE)


class OpenAILLM:
    """Implements ``pipeline.protocols.LLM`` over ``openai.AsyncOpenAI``."""

    def __init__(
        self,
        *,
        base_url: str,
        api_key: str = "",
        models: Mapping[str, str] | Callable[[str], str] | None = None,
        model_for: Callable[[str], str] | None = None,
        default_model: str | None = None,
        timeout_s: float = 30.0,
        max_retries: int = 3,
        concurrency: int = 8,
        backoff_base_s: float = 0.5,
        backoff_max_s: float = 8.0,
        retry_after_cap_s: float = 30.0,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        if (models is None) == (model_for is None):
            raise ConfigError("OpenAILLM needs exactly one of models= or model_for=")
        resolver = models if models is not None else model_for
        assert resolver is not None
        self._models: Mapping[str, str] | Callable[[str], str] = resolver
        self._default_model = default_model
        self.max_retries = max(0, int(max_retries))
        self.backoff_base_s = backoff_base_s
        self.backoff_max_s = backoff_max_s
        self.retry_after_cap_s = retry_after_cap_s
        self._semaphore = asyncio.Semaphore(max(1, int(concurrency)))
        self._n_unsupported: set[str] = set()  # models whose endpoint rejected n>1
        # A placeholder key keeps the SDK from demanding OPENAI_API_KEY for keyless local servers.
        self._client = openai.AsyncOpenAI(
            base_url=self.base_url, api_key=api_key or "unused", max_retries=0, timeout=timeout_s
        )

    def __repr__(self) -> str:  # never shows the key
        return f"OpenAILLM(base_url={self.base_url!r})"

    # ------------------------------------------------------------ Protocol LLM

    def model_for(self, role: str) -> str:
        if callable(self._models):
            return self._models(role)
        model = self._models.get(role) or self._models.get("default") or self._default_model
        if not model:
            raise ConfigError(f"no LLM model configured for role '{role}'")
        return model

    async def complete(
        self,
        messages: Sequence[ChatMessage],
        *,
        role: str = "answer",
        max_tokens: int | None = None,
        temperature: float = 0.0,
        n: int = 1,
    ) -> list[str]:
        """``n`` completions' texts ("" for empty content). Tries one request with ``n`` first, then falls
        back to separate concurrent requests when the endpoint rejects ``n`` or returns fewer choices."""
        model = self.model_for(role)
        payload = _chat_payload(model, messages, temperature, max_tokens)
        if n <= 1:
            return (await self._create(payload))[:1] or [""]
        texts: list[str] = []
        if model not in self._n_unsupported:
            try:
                texts = await self._create({**payload, "n": n})
            except _NRejectedError:
                log.info("LLM endpoint rejected n=%d for model %s; using separate calls", n, model)
                self._n_unsupported.add(model)
        missing = n - len(texts)
        if missing > 0:
            more = await asyncio.gather(*(self._create(payload) for _ in range(missing)))
            texts.extend(r[0] if r else "" for r in more)
        return texts[:n]

    async def stream(self, messages: Sequence[ChatMessage], *, on_text: Callable[[str], Awaitable[None]],
                     role: str = "answer", max_tokens: int | None = None, temperature: float = 0.0) -> str:
        """One completion streamed: ``on_text`` gets each piece of text as it arrives; returns the whole text.
        Retried like ``complete`` until the first piece arrives; a failure after that is not retried (the
        user has seen part of the answer) and raises ``RemoteError``."""
        model = self.model_for(role)
        payload = {**_chat_payload(model, messages, temperature, max_tokens), "stream": True}

        async def call() -> str:
            parts: list[str] = []
            stream = await self._client.chat.completions.create(**payload)
            try:
                async for chunk in stream:
                    delta = (
                        chunk.choices[0].delta.content if chunk.choices and chunk.choices[0].delta else None
                    )
                    if delta:
                        parts.append(delta)
                        await on_text(delta)
            except openai.OpenAIError as exc:
                if parts:
                    raise RemoteError(
                        f"the answer stream broke off: {type(exc).__name__}", service="llm"
                    ) from exc
                raise
            return "".join(parts)

        return await self._with_retries(call, model=model)

    async def ping(self) -> None:
        """Readiness check: one GET /models, falling back to a 1-token completion where /models is missing.
        No retries, so a broken configuration fails fast with the same errors as ``complete``."""
        try:
            async with self._semaphore:
                await self._client.models.list()
            return
        except openai.NotFoundError:
            pass
        except openai.OpenAIError as exc:
            raise self._map_error(exc, model=None) from exc
        await self._create(
            {
                "model": self.model_for("answer"),
                "messages": [{"role": "user", "content": "ping"}],
                "max_tokens": 1,
            },
            retries=0,
        )

    async def score_continuation(
        self, prompt: str, continuation: str, *, role: str = "counterfactual"
    ) -> float:
        """Mean log-prob per token of ``continuation`` after ``prompt`` (teacher forcing).

        Uses the legacy ``/v1/completions`` wire format with ``echo`` and ``logprobs``, which vLLM and
        llama.cpp's servers answer with the prompt's own token log-probs; the tokens that spell
        ``continuation`` are averaged. One token is generated because some servers read ``max_tokens=0``
        as "no limit".
        """
        model = self.model_for(role)
        text = prompt + continuation

        async def call() -> float:
            resp = await self._client.completions.create(
                model=model, prompt=text, max_tokens=1, temperature=0.0, echo=True, logprobs=1)
            choice = resp.choices[0] if resp.choices else None
            return continuation_logprob(
                getattr(choice, "logprobs", None),
                text=text,
                continuation=continuation,
                echoed=getattr(choice, "text", None),
            )

        return await self._with_retries(call, model=model)

    async def close(self) -> None:
        await self._client.close()

    # ------------------------------------------------------------ internals

    async def _create(self, payload: dict[str, Any], *, retries: int | None = None) -> list[str]:
        """One logical chat request with retries; returns the choices' texts in index order."""

        async def call() -> list[str]:
            resp = await self._client.chat.completions.create(**payload)
            choices = sorted(resp.choices or [], key=lambda c: c.index)
            return [(c.message.content or "") if c.message else "" for c in choices]

        return await self._with_retries(call, model=payload["model"], wants_n=payload.get("n", 1) > 1,
                                        retries=retries)

    async def _with_retries(self, call: Callable[[], Awaitable[T]], *, model: str, wants_n: bool = False,
                            retries: int | None = None) -> T:
        """Run ``call`` under the concurrency cap; retry 429/5xx/timeouts/connection errors
        (``pipeline.runtime.remote``)."""
        policy = RetryPolicy(max_retries=self.max_retries if retries is None else retries,
                             initial_s=self.backoff_base_s, max_s=self.backoff_max_s,
                             retry_after_cap_s=self.retry_after_cap_s)

        async def once() -> T:
            try:
                async with self._semaphore:
                    return await call()
            except openai.OpenAIError as exc:
                raise self._map_error(exc, model=model, wants_n=wants_n) from exc

        return await call_with_retries(once, policy, CallOptions(log, "LLM request"))

    def _map_error(self, exc: openai.OpenAIError, *, model: str | None, wants_n: bool = False) -> RemoteError:
        where = self.base_url
        if isinstance(exc, openai.APITimeoutError):
            return TransientError(f"LLM request to {where} timed out", service=SERVICE)
        if isinstance(exc, openai.APIConnectionError):
            if _is_connect_failure(exc):
                return UnreachableError(f"cannot reach LLM endpoint {where}", service=SERVICE)
            return TransientError(f"connection to LLM endpoint {where} failed: {exc}", service=SERVICE)
        if isinstance(exc, openai.APIStatusError):
            status = exc.status_code
            if status == 404:
                what = f"model '{model}'" if model else "endpoint"
                return NotFoundError(f"{what} not found at {where}", service=SERVICE, status=status)
            if status in (400, 422) and wants_n and _N_PARAM.search(_error_text(exc)):
                return _NRejectedError(_error_text(exc))
            if status in (401, 403):
                what = "LLM endpoint rejected the API key"
            elif status == 429 or status >= 500 or status == 408:
                what = f"LLM endpoint {where} failed"
            else:
                what = f"LLM endpoint {where} refused the request: {_error_text(exc)[:200]}"
            return status_error(status, service=SERVICE, what=what, headers=exc.response.headers,
                                auth_hint="EVIDENT_LLM_API_KEY")
        return RemoteError(f"LLM request to {where} failed: {type(exc).__name__}", service=SERVICE)


def continuation_logprob(logprobs: Any, *, text: str, continuation: str, echoed: str | None) -> float:
    """Mean of ``token_logprobs`` over the tokens that spell ``continuation`` at the end of ``text``.

    Offsets are anchored at the END of the echoed text: vLLM's ``text_offset`` counts characters of the
    prompt, but llama.cpp's counts the detokenized text, where special tokens (``<|im_start|>``) are
    empty, so only the distance from the end means the same on both. ``echoed`` (the returned text) tells
    how many generated characters follow the continuation. A server that ignores ``echo`` or
    ``logprobs`` returns no prompt tokens; that is a ``RemoteError``, not a silent zero.
    """
    tokens = list(getattr(logprobs, "tokens", None) or [])
    offsets = list(getattr(logprobs, "text_offset", None) or [])
    values = list(getattr(logprobs, "token_logprobs", None) or [])
    picked: list[float] = []
    if tokens and len(tokens) == len(offsets) == len(values):
        generated = len(echoed) - len(text) if echoed is not None and echoed.startswith(text) else 0
        end = offsets[-1] + len(tokens[-1]) - generated
        start = end - len(continuation)
        picked = [float(v) for tok, off, v in zip(tokens, offsets, values, strict=True)
                  if v is not None and off < end and off + max(1, len(tok)) > start]
    if not picked or len(picked) >= len(values):  # nothing, or no prompt tokens: the prompt was not echoed
        raise RemoteError("the LLM endpoint returned no prompt log-probs (it needs /v1/completions with "
                          "echo and logprobs, as vLLM and llama.cpp serve)", service=SERVICE)
    return sum(picked) / len(picked)


class _NRejectedError(RemoteError):
    """Internal: the endpoint does not support ``n`` > 1."""


def _error_text(exc: openai.APIStatusError) -> str:
    body = exc.body
    if isinstance(body, dict):
        err = body.get("error", body)
        if isinstance(err, dict):
            return " ".join(str(err.get(k) or "") for k in ("message", "param")).strip()
        return str(err)
    return str(exc.message)


def _is_connect_failure(exc: BaseException) -> bool:
    """True when no connection could be made at all (refused, DNS, no route) rather than a reset mid-call."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, ConnectionRefusedError | socket.gaierror) or type(cur).__name__ == "ConnectError":
            return True
        cur = cur.__cause__ or cur.__context__
    return False


def _chat_payload(model: str, messages: Sequence[ChatMessage], temperature: float,
                  max_tokens: int | None) -> dict[str, Any]:
    """The chat-completions body. Every prompt path ends here: no untrusted text reaches the model as a chat
    control token."""
    payload: dict[str, Any] = {
        "model": model,
        "messages": [{"role": m.role, "content": neutralize_special_tokens(m.content)} for m in messages],
        "temperature": temperature,
    }
    if max_tokens is not None:
        payload["max_tokens"] = max_tokens
    return payload

