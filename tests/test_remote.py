"""The one remote-call helper: Retry-After parsing, status -> error, retries honouring the server's wait."""

from __future__ import annotations

import logging
from datetime import UTC, datetime

import pytest

from pipeline.errors import (
    AuthError,
    NotFoundError,
    RateLimitedError,
    RemoteError,
    TransientError,
    UnreachableError,
)
from pipeline.runtime.remote import CallOptions, RetryPolicy, call_with_retries, retry_after_s, status_error


def test_retry_after_header_parsing() -> None:
    assert retry_after_s({"retry-after": "2"}) == 2.0
    assert retry_after_s({"Retry-After": "2"}) == 2.0  # any case
    assert retry_after_s({"retry-after-ms": "1500"}) == 1.5
    assert retry_after_s({}) is None and retry_after_s(None) is None
    assert retry_after_s({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}) == 0.0
    now = datetime(2015, 10, 21, 7, 27, 50, tzinfo=UTC)
    assert retry_after_s({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}, now=now) == 10.0
    assert retry_after_s({"retry-after": "soon"}) is None


@pytest.mark.parametrize(("status", "kind"), [(429, RateLimitedError), (503, TransientError),
                                             (500, TransientError),
                                             (408, TransientError), (401, AuthError), (403, AuthError),
                                             (404, NotFoundError), (400, RemoteError)])
def test_status_error_classes_carry_the_servers_wait(status: int, kind: type[RemoteError]) -> None:
    exc = status_error(
        status, service="x", what="X answered", headers={"Retry-After": "7"}, auth_hint="X_TOKEN"
    )
    assert type(exc) is kind and exc.status == status and exc.service == "x"
    assert exc.retry_after_s == (7.0 if status in (429, 503, 500, 408) else None)
    assert (("check X_TOKEN" in str(exc)) == (kind is AuthError)) and f"HTTP {status}" in str(exc)


def test_status_error_messages_are_redacted() -> None:
    exc = status_error(500, service="x", what="POST https://user:hunter22@host/x?token=abc123 answered")
    assert "hunter22" not in str(exc) and "abc123" not in str(exc)


async def test_a_503_waits_as_long_as_its_retry_after_says() -> None:
    waits: list[float] = []
    calls = iter([TransientError("busy", status=503, retry_after_s=2.5), None])

    async def call() -> str:
        exc = next(calls)
        if exc is not None:
            raise exc
        return "ok"

    async def sleep(s: float) -> None:
        waits.append(s)

    policy = RetryPolicy(max_retries=3, initial_s=0.4, max_s=30)
    assert (
        await call_with_retries(call, policy, CallOptions(logging.getLogger("t"), "x"), sleep=sleep) == "ok"
    )
    assert 2.5 <= waits[0] <= 2.6


async def test_a_refused_host_that_answers_is_not_retried_and_the_budget_is_kept() -> None:
    tries = 0

    async def refused() -> None:
        nonlocal tries
        tries += 1
        raise UnreachableError("wrong base URL", status=404)

    async def nap(_s: float) -> None:
        return None

    with pytest.raises(UnreachableError):
        await call_with_retries(
            refused, RetryPolicy(max_retries=3), CallOptions(logging.getLogger("t"), "x"), sleep=nap
        )
    assert tries == 1

    async def busy() -> None:
        nonlocal tries
        tries += 1
        raise RateLimitedError("slow down", retry_after_s=0)

    tries = 0
    with pytest.raises(RateLimitedError):
        await call_with_retries(
            busy, RetryPolicy(max_retries=2), CallOptions(logging.getLogger("t"), "x"), sleep=nap
        )
    assert tries == 3
