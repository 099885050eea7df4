"""Prometheus metrics without a global registry: one ``Metrics`` object is built at start-up and passed in.

Self-written (counters, histograms, text exposition format 0.0.4) so the bot needs no extra dependency
and tests can create as many independent registries as they like. Updates take a lock because sync work
runs in worker threads (``asyncio.to_thread``) while the event loop renders ``/metrics``.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from pipeline.errors import (
    AuthError,
    EvidentError,
    NotFoundError,
    RateLimitedError,
    RemoteError,
    TransientError,
    UnreachableError,
)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# Seconds; answers take from ~0.1 s (offline extractive) to tens of seconds (remote LLM + retries).
DEFAULT_BUCKETS: tuple[float, ...] = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0)

LabelValues = tuple[str, ...]


def _fmt(value: float) -> str:
    """Format a sample value the way Prometheus parses it (Go float syntax)."""
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if math.isnan(value):
        return "NaN"
    return repr(float(value))


def _escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _escape_help(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n")


def _labels(names: Sequence[str], values: Sequence[str], extra: str = "") -> str:
    parts = [f'{n}="{_escape_label(v)}"' for n, v in zip(names, values, strict=True)]
    if extra:
        parts.append(extra)
    return "{" + ",".join(parts) + "}" if parts else ""


class _Metric:
    """Shared name/help/label handling; subclasses hold the samples."""

    kind = ""

    def __init__(self, name: str, help_: str, labelnames: Sequence[str] = ()) -> None:
        self.name = name
        self.help = help_
        self.labelnames: tuple[str, ...] = tuple(labelnames)
        self._lock = threading.Lock()

    def _key(self, labels: dict[str, str]) -> LabelValues:
        if set(labels) != set(self.labelnames):
            # A programming error in the caller, not a runtime condition: fail loudly.
            raise ValueError(f"{self.name} takes labels {list(self.labelnames)}, got {sorted(labels)}")
        return tuple(str(labels[n]) for n in self.labelnames)

    def _header(self) -> list[str]:
        return [f"# HELP {self.name} {_escape_help(self.help)}", f"# TYPE {self.name} {self.kind}"]

    def expose(self) -> list[str]:
        """This metric's lines in the text exposition format."""
        raise NotImplementedError


class Counter(_Metric):
    """A monotonically increasing count, optionally split by labels."""

    kind = "counter"

    def __init__(self, name: str, help_: str, labelnames: Sequence[str] = ()) -> None:
        super().__init__(name, help_, labelnames)
        self._values: dict[LabelValues, float] = {} if labelnames else {(): 0.0}

    def inc(self, amount: float = 1.0, **labels: str) -> None:
        if amount < 0:
            raise ValueError(f"{self.name}: counters only go up (got {amount})")
        key = self._key(labels)
        with self._lock:
            self._values[key] = self._values.get(key, 0.0) + amount

    def value(self, **labels: str) -> float:
        key = self._key(labels)
        with self._lock:
            return self._values.get(key, 0.0)

    def expose(self) -> list[str]:
        with self._lock:
            items = sorted(self._values.items())
        return self._header() + [f"{self.name}{_labels(self.labelnames, k)} {_fmt(v)}" for k, v in items]


class _HistogramSeries:
    __slots__ = ("buckets", "count", "sum")

    def __init__(self, n: int) -> None:
        self.buckets = [0] * n
        self.count = 0
        self.sum = 0.0


class Histogram(_Metric):
    """Observed durations in cumulative buckets, plus their sum and count."""

    kind = "histogram"

    def __init__(self, name: str, help_: str, labelnames: Sequence[str] = (),
                 buckets: Sequence[float] = DEFAULT_BUCKETS) -> None:
        super().__init__(name, help_, labelnames)
        bounds = sorted(float(b) for b in buckets)
        if not bounds or bounds[-1] != math.inf:
            bounds.append(math.inf)
        self.bounds: tuple[float, ...] = tuple(bounds)
        self._series: dict[LabelValues, _HistogramSeries] = {} if labelnames else {(): self._new()}

    def _new(self) -> _HistogramSeries:
        return _HistogramSeries(len(self.bounds))

    def observe(self, value: float, **labels: str) -> None:
        key = self._key(labels)
        with self._lock:
            series = self._series.get(key)
            if series is None:
                series = self._series[key] = self._new()
            for i, bound in enumerate(self.bounds):
                if value <= bound:
                    series.buckets[i] += 1
                    break
            series.count += 1
            series.sum += value

    @contextmanager
    def time(self, **labels: str) -> Iterator[None]:
        """Observe the wall-clock duration of the ``with`` block (also when it raises)."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.observe(time.perf_counter() - start, **labels)

    def count(self, **labels: str) -> int:
        key = self._key(labels)
        with self._lock:
            series = self._series.get(key)
            return series.count if series else 0

    def sum(self, **labels: str) -> float:
        key = self._key(labels)
        with self._lock:
            series = self._series.get(key)
            return series.sum if series else 0.0

    def expose(self) -> list[str]:
        lines = self._header()
        with self._lock:
            snapshot = sorted((k, list(s.buckets), s.count, s.sum) for k, s in self._series.items())
        for key, buckets, count, total in snapshot:
            cumulative = 0
            for bound, n in zip(self.bounds, buckets, strict=True):
                cumulative += n
                le = f'le="{_fmt(bound)}"'
                lines.append(f"{self.name}_bucket{_labels(self.labelnames, key, le)} {cumulative}")
            lines.append(f"{self.name}_sum{_labels(self.labelnames, key)} {_fmt(total)}")
            lines.append(f"{self.name}_count{_labels(self.labelnames, key)} {count}")
        return lines


class Metrics:
    """Every metric evident exports; build one per process and pass it to the components that count."""

    def __init__(self, buckets: Sequence[float] = DEFAULT_BUCKETS) -> None:
        self.questions = Counter("evident_questions_total", "Questions received from Slack or the CLI.")
        self.llm_calls = Counter("evident_llm_calls_total", "Requests sent to the LLM endpoint, by role.",
                                 ("role",))
        self.llm_errors = Counter("evident_llm_errors_total", "Failed LLM requests, by error kind.", ("kind",))
        self.sync_pages = Counter("evident_sync_pages_total",
                                  "Pages handled by Confluence sync, by result (e.g. indexed, unchanged, "
                                  "deleted, failed).", ("result",))
        self.sync_errors = Counter("evident_sync_errors_total", "Sync runs that failed.")
        self.answer_seconds = Histogram("evident_answer_seconds", "Time from question to posted answer.",
                                        buckets=buckets)
        self.explain_seconds = Histogram("evident_explain_seconds",
                                         "Time to compute a causal explanation (attribution).", buckets=buckets)

    def all(self) -> list[_Metric]:
        return [self.questions, self.llm_calls, self.llm_errors, self.sync_pages, self.sync_errors,
                self.answer_seconds, self.explain_seconds]

    def render(self) -> str:
        """Text exposition format 0.0.4, served with ``CONTENT_TYPE``."""
        lines: list[str] = []
        for metric in self.all():
            lines.extend(metric.expose())
        return "\n".join(lines) + "\n"


def error_kind(exc: BaseException) -> str:
    """A small, stable label value for ``evident_llm_errors_total{kind}`` (never the message: cardinality)."""
    for cls, kind in ((RateLimitedError, "rate_limited"), (TransientError, "transient"), (AuthError, "auth"),
                      (NotFoundError, "not_found"), (UnreachableError, "unreachable"), (RemoteError, "remote"),
                      (EvidentError, "evident")):
        if isinstance(exc, cls):
            return kind
    return "other"
