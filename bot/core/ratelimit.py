"""Per-user token bucket, so one user cannot monopolise the LLM budget of a whole workspace."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class _Bucket:
    tokens: float
    updated: float


class UserRateLimiter:
    """``rate_per_min`` questions per user per minute, with bursts up to the same number.

    ``rate_per_min <= 0`` disables limiting. ``clock`` is injectable so tests need no sleeps.
    """

    def __init__(self, rate_per_min: int, *, clock: Callable[[], float] = time.monotonic,
                 max_users: int = 50_000) -> None:
        self._capacity = float(rate_per_min)
        self._per_s = rate_per_min / 60.0
        self._clock = clock
        self._buckets: dict[str, _Bucket] = {}
        self._max_users = max_users

    def _bucket(self, user_id: str, now: float) -> _Bucket:
        b = self._buckets.get(user_id)
        if b is None:
            if len(self._buckets) >= self._max_users:
                self._buckets.clear()  # full buckets are the default state; forgetting them is safe
            b = self._buckets[user_id] = _Bucket(self._capacity, now)
        else:
            b.tokens = min(self._capacity, b.tokens + (now - b.updated) * self._per_s)
            b.updated = now
        return b

    def allow(self, user_id: str) -> bool:
        """Take one token for ``user_id``; False when the bucket is empty."""
        if self._capacity <= 0:
            return True
        b = self._bucket(user_id, self._clock())
        if b.tokens >= 1.0:
            b.tokens -= 1.0
            return True
        return False

    def retry_after_s(self, user_id: str) -> int:
        """Whole seconds until ``user_id`` may ask again (0 when allowed now)."""
        if self._capacity <= 0:
            return 0
        b = self._bucket(user_id, self._clock())
        return 0 if b.tokens >= 1.0 else math.ceil((1.0 - b.tokens) / self._per_s)
