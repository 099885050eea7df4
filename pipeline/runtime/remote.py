"""The one helper every remote client calls through: retry policy, ``Retry-After``, status → error, redaction.

- ``RetryPolicy``: how many retries and how long to wait. A server's ``Retry-After`` (or ``retry-after-ms``)
  is honoured on 429 **and** on 5xx (RFC 9110 allows it on 503), capped at ``retry_after_cap_s``, plus a
  little jitter so parallel callers do not stampede; without one the wait is exponential with full jitter.
- ``status_error``: an HTTP status (and headers) as the ``pipeline.errors`` class that says what it means,
  with ``retry_after_s`` carried on the exception, never parsed from a message. Messages pass the redactor.
- ``call_with_retries`` / ``call_with_retries_sync``: run a call under a policy on tenacity.

Used by the LLM, embeddings, Confluence, Jira and Bot Connector clients (Slack's Web API client has the
SDK's own retry handlers).
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any, TypeVar

from tenacity import AsyncRetrying, RetryCallState, Retrying, retry_if_exception, stop_after_attempt
from tenacity import wait_random_exponential as _wait_random_exponential
from tenacity.wait import wait_base

from pipeline.errors import (
    AuthError,
    NotFoundError,
    RateLimitedError,
    RemoteError,
    TransientError,
    UnreachableError,
)
from pipeline.runtime.redact import redact

T = TypeVar("T")
UNLIMITED = 10**9  # a ``max_retries`` this large means "until it works or the caller gives up"


@dataclass(frozen=True)
class RetryPolicy:
    """How a client retries: ``max_retries`` after the first try, exponential jitter from ``initial_s`` up to
    ``max_s`` when the server names no wait, its ``Retry-After`` up to ``retry_after_cap_s`` when it does."""

    max_retries: int
    initial_s: float = 0.5
    max_s: float = 30.0
    retry_after_cap_s: float = 60.0


class retry_after_wait(wait_base):
    """Wait ``exc.retry_after_s`` when the failed attempt's exception carries it, else exponential jitter."""

    def __init__(
        self, *, initial_s: float = 0.5, max_s: float = 30.0, retry_after_cap_s: float | None = None
    ) -> None:
        self._fallback = _wait_random_exponential(multiplier=initial_s, max=max_s)
        self._initial = initial_s
        self._cap = max_s if retry_after_cap_s is None else retry_after_cap_s

    def __call__(self, retry_state: RetryCallState) -> float:
        outcome = retry_state.outcome
        exc = outcome.exception() if outcome is not None and outcome.failed else None
        after = getattr(exc, "retry_after_s", None)
        if after is not None:
            return min(max(0.0, float(after)), self._cap) + random.uniform(0, self._initial / 4)
        return float(self._fallback(retry_state))


def retry_after_s(headers: Mapping[str, str] | None, *, now: datetime | None = None) -> float | None:
    """Seconds the server asks to wait: ``retry-after-ms``, or ``Retry-After`` as delta-seconds or an HTTP
    date; None when absent or unreadable. Header names match in any case."""
    if not headers:
        return None
    headers = {str(k).lower(): str(v) for k, v in headers.items()}
    ms = headers.get("retry-after-ms")
    if ms:
        try:
            return max(0.0, float(ms) / 1000)
        except ValueError:
            pass
    raw = headers.get("retry-after")
    if not raw:
        return None
    try:
        return max(0.0, float(raw))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(raw)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - (now or datetime.now(UTC))).total_seconds())


def status_error(status: int, *, service: str, what: str, headers: Mapping[str, str] | None = None,
                 auth_hint: str = "") -> RemoteError:
    """The error for an HTTP ``status``: 429 → ``RateLimitedError``, 408 and 5xx → ``TransientError`` (both
    with the server's ``Retry-After``), 401/403 → ``AuthError`` (``auth_hint`` names the setting), 404 →
    ``NotFoundError``, anything else → ``RemoteError``. ``what`` says which call; it is redacted."""
    text = redact(f"{what} (HTTP {status})")
    if status == 429:
        return RateLimitedError(text, service=service, status=status, retry_after_s=retry_after_s(headers))
    if status >= 500 or status == 408:
        return TransientError(text, service=service, status=status, retry_after_s=retry_after_s(headers))
    if status in (401, 403):
        return AuthError(
            f"{text}{': check ' + auth_hint if auth_hint else ''}", service=service, status=status
        )
    if status == 404:
        return NotFoundError(text, service=service, status=status)
    return RemoteError(text, service=service, status=status)


def retryable(exc: BaseException) -> bool:
    """Rate limits, transient failures and hosts that could not be reached at all (no status: a wrong base URL
    that answers is not retried)."""
    if isinstance(exc, UnreachableError):
        return exc.status is None
    return isinstance(exc, RateLimitedError | TransientError)


def _before_sleep(logger: logging.Logger, what: str, budget: int, level: int,
                  count: Callable[[], None] | None) -> Callable[[RetryCallState], None]:
    of = f"/{budget}" if budget < UNLIMITED else ""

    def hook(state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome is not None else None
        wait = state.next_action.sleep if state.next_action is not None else 0.0
        reason = f"{type(exc).__name__}: {redact(str(exc))[:200]}"
        logger.log(level, "%s failed (%s); retry %d%s in %.2fs", what, reason, state.attempt_number, of, wait)
        if count is not None:
            count()

    return hook


@dataclass(frozen=True)
class CallOptions:
    """What a call under ``call_with_retries`` reports and decides besides the policy."""

    logger: logging.Logger
    what: str
    retry: Callable[[BaseException], bool] = retryable
    level: int = logging.WARNING
    count: Callable[[], None] | None = None


def _tenacity_kwargs(policy: RetryPolicy, options: CallOptions) -> dict[str, Any]:
    return {
        "stop": stop_after_attempt(max(0, policy.max_retries) + 1),
        "wait": retry_after_wait(
            initial_s=policy.initial_s, max_s=policy.max_s, retry_after_cap_s=policy.retry_after_cap_s
        ),
        "retry": retry_if_exception(options.retry),
        "before_sleep": _before_sleep(
            options.logger, options.what, policy.max_retries, options.level, options.count
        ),
        "reraise": True,
    }


async def call_with_retries(call: Callable[[], Awaitable[T]], policy: RetryPolicy, options: CallOptions, *,
                            sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> T:
    """Await ``call()`` until it succeeds, raises what ``options.retry`` refuses, or the policy is spent."""
    async for attempt in AsyncRetrying(sleep=sleep, **_tenacity_kwargs(policy, options)):
        with attempt:
            return await call()
    raise AssertionError("unreachable: tenacity re-raises the last error")  # pragma: no cover


def call_with_retries_sync(call: Callable[[], T], policy: RetryPolicy, options: CallOptions) -> T:
    """``call_with_retries`` for blocking clients that run in a worker thread."""
    for attempt in Retrying(**_tenacity_kwargs(policy, options)):
        with attempt:
            return call()
    raise AssertionError("unreachable: tenacity re-raises the last error")  # pragma: no cover
