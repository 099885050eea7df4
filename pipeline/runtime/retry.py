"""One retry policy for remote calls, on tenacity: waits honour the server's ``Retry-After``.

The wait comes from the exception (``RateLimitedError.retry_after_s``, see ``pipeline.errors``), never
from parsing a message, capped at ``retry_after_cap_s`` plus a little jitter so parallel callers do not
stampede; without one it is exponential with full jitter (``uniform(0, min(max_s, initial_s * 2**n))``).
Used by the LLM client, the Confluence client and the embeddings client.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable

from tenacity import RetryCallState, wait_random_exponential
from tenacity.wait import wait_base


class retry_after_wait(wait_base):
    """Wait ``exc.retry_after_s`` when the failed attempt's exception carries it, else exponential jitter."""

    def __init__(self, *, initial_s: float = 0.5, max_s: float = 30.0, retry_after_cap_s: float | None = None) -> None:
        self._fallback = wait_random_exponential(multiplier=initial_s, max=max_s)
        self._initial = initial_s
        self._cap = max_s if retry_after_cap_s is None else retry_after_cap_s

    def __call__(self, retry_state: RetryCallState) -> float:
        outcome = retry_state.outcome
        exc = outcome.exception() if outcome is not None and outcome.failed else None
        after = getattr(exc, "retry_after_s", None)
        if after is not None:
            return min(max(0.0, float(after)), self._cap) + random.uniform(0, self._initial / 4)
        return float(self._fallback(retry_state))


def log_retry(logger: logging.Logger, what: str, budget: int, *, level: int = logging.WARNING,
              count: Callable[[], None] | None = None) -> Callable[[RetryCallState], None]:
    """A tenacity ``before_sleep`` hook: one log line per retry (and an optional counter)."""

    def hook(state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome is not None else None
        wait = state.next_action.sleep if state.next_action is not None else 0.0
        logger.log(level, "%s failed (%s); retry %d/%d in %.2fs", what, exc if level < logging.WARNING
                   else type(exc).__name__, state.attempt_number, budget, wait)
        if count is not None:
            count()

    return hook
