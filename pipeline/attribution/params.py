"""Validated attribution parameters.

Callers pass a plain ``params`` dict (easy to build from settings, CLI flags or an eval grid); it is
checked once here so a typo or an impossible value fails loudly with a ``ConfigError``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pipeline.errors import ConfigError
from pipeline.types import Hit

Generate = Callable[[Sequence[Hit], int], Awaitable[list[str]]]
"""generate(subset_of_hits_in_original_order, m) -> m answers generated from only those hits."""

Score = Callable[[Sequence[Hit], str], Any]
"""score(hits, answer) -> mean per-token log-prob of ``answer`` given ``hits`` (sync or async)."""

UNCHANGED = 0.98  # mean similarity at/above which a counterfactual answer counts as "the same"
SAME = 1e-9  # float tolerance: the cosine of two identical answers' unit vectors can be 1 - 2e-16


@dataclass(frozen=True)
class AttributionParams:
    samples: int = 1  # m: Monte Carlo answers per counterfactual
    temperature: float = 0.05  # t of softmax(c / t)
    eps: float = 0.005  # DBSCAN eps (cosine distance)
    min_samples: int = 2  # DBSCAN minPts
    concurrency: int | None = None  # local cap on in-flight generation calls (None: no local cap)
    semaphore: asyncio.Semaphore | None = None  # a shared cap instead (e.g. the engine's)
    citation_lambda: float = 1.0  # cfa_citation_prior: p ∝ softmax(c/t) * (1 + λ·cited)
    tau: float = 0.9  # sufficiency: similarity at which a cluster alone reproduces the answer
    boost: float = 1.0  # sufficiency: a sufficient cluster's share is multiplied by (1 + boost)
    delta: float = 0.3  # early_stop: stop once top share − second share > delta
    round_size: int = 1  # early_stop: samples drawn per cluster per round
    unchanged: float = UNCHANGED  # a regeneration this similar (mean) is the same answer: contribution 0
    score: Score | None = None  # logprob: teacher-forcing scorer

    def limiter(self) -> contextlib.AbstractAsyncContextManager[Any]:
        """The context manager every generation call runs under."""
        if self.semaphore is not None:
            return self.semaphore
        if self.concurrency is not None:
            return asyncio.Semaphore(self.concurrency)
        return contextlib.nullcontext()

    def public(self) -> dict[str, Any]:
        """JSON-safe values recorded in results (no semaphore / callables)."""
        return {
            "samples": self.samples,
            "temperature": self.temperature,
            "eps": self.eps,
            "min_samples": self.min_samples,
            "concurrency": self.concurrency,
            "citation_lambda": self.citation_lambda,
            "tau": self.tau,
            "boost": self.boost,
            "delta": self.delta,
            "round_size": self.round_size,
            "unchanged": self.unchanged,
        }


_FIELDS = set(AttributionParams.__dataclass_fields__)


def parse_params(params: Mapping[str, Any] | None) -> AttributionParams:
    """Validate a params dict; unknown keys and out-of-range values raise ``ConfigError``."""
    params = dict(params or {})
    unknown = sorted(set(params) - _FIELDS)
    if unknown:
        raise ConfigError(f"unknown attribution parameter(s): {', '.join(unknown)}")
    try:
        p = AttributionParams(**params)
    except TypeError as exc:  # pragma: no cover - guarded by the key check above
        raise ConfigError(f"invalid attribution parameters: {exc}") from exc
    checks = [
        (isinstance(p.samples, int) and p.samples >= 1, "samples must be an integer >= 1"),
        (p.temperature > 0, "temperature must be > 0"),
        (0 < p.eps <= 2, "eps must be in (0, 2]"),
        (isinstance(p.min_samples, int) and p.min_samples >= 1, "min_samples must be an integer >= 1"),
        (p.concurrency is None or (isinstance(p.concurrency, int) and p.concurrency >= 1),
         "concurrency must be an integer >= 1"),
        (p.citation_lambda >= 0, "citation_lambda must be >= 0"),
        (-1 <= p.tau <= 1, "tau must be in [-1, 1]"),
        (p.boost >= 0, "boost must be >= 0"),
        (0 <= p.delta <= 1, "delta must be in [0, 1]"),
        (isinstance(p.round_size, int) and p.round_size >= 1, "round_size must be an integer >= 1"),
        (0 < p.unchanged <= 1, "unchanged must be in (0, 1]"),
        (p.score is None or callable(p.score), "score must be callable"),
    ]
    for ok, message in checks:
        if not ok:
            raise ConfigError(f"attribution: {message}")
    return p
