"""One retry policy for remote calls, on tenacity: waits honour the server's ``Retry-After``.

The wait comes from the exception (``RateLimitedError.retry_after_s``, see ``pipeline.errors``), never
from parsing a message; without one it backs off exponentially with jitter, capped at ``max_s``.
"""

from __future__ import annotations

from tenacity import RetryCallState, wait_exponential_jitter
from tenacity.wait import wait_base


class retry_after_wait(wait_base):
    """Wait ``exc.retry_after_s`` when the failed attempt's exception carries it, else exponential jitter."""

    def __init__(self, *, initial_s: float = 0.5, max_s: float = 30.0) -> None:
        self._fallback = wait_exponential_jitter(multiplier=initial_s, max=max_s)
        self._max = max_s

    def __call__(self, retry_state: RetryCallState) -> float:
        outcome = retry_state.outcome
        exc = outcome.exception() if outcome is not None and outcome.failed else None
        after = getattr(exc, "retry_after_s", None)
        if after is not None:
            return min(max(0.0, float(after)), self._max)
        return float(self._fallback(retry_state))
