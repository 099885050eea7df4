"""Prometheus metrics on ``prometheus_client``, without its global registry.

One ``Metrics`` object (its own ``CollectorRegistry``) is built at start-up and passed in, so tests can
create as many independent registries as they like. ``Counter`` and ``Histogram`` are thin adapters that
keep evident's small interface (``inc``/``value``, ``observe``/``time``/``count``/``sum``) and check label
names and increments up front with messages that say what is wrong; the library does the counting (thread
safe) and the text exposition format.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import prometheus_client
from prometheus_client import CollectorRegistry, generate_latest

from pipeline.errors import (
    AuthError,
    EvidentError,
    NotFoundError,
    RateLimitedError,
    RemoteError,
    TransientError,
    UnreachableError,
)

CONTENT_TYPE = prometheus_client.CONTENT_TYPE_PLAIN_0_0_4  # the text format generate_latest writes

# Seconds; answers take from ~0.1 s (offline extractive) to tens of seconds (remote LLM + retries).
DEFAULT_BUCKETS: tuple[float, ...] = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0)

prometheus_client.disable_created_metrics()  # no *_created series: they add nothing a dashboard uses


class _Metric:
    def __init__(
        self, name: str, help_: str, labelnames: Sequence[str], registry: CollectorRegistry | None
    ) -> None:
        self.name = name
        self.labelnames: tuple[str, ...] = tuple(labelnames)
        self.registry = registry if registry is not None else CollectorRegistry()

    def _child(self, metric: Any, labels: dict[str, str]) -> Any:
        if set(labels) != set(self.labelnames):
            # A programming error in the caller, not a runtime condition: fail loudly.
            raise ValueError(f"{self.name} takes labels {list(self.labelnames)}, got {sorted(labels)}")
        return metric.labels(**{k: str(v) for k, v in labels.items()}) if self.labelnames else metric

    def _sample(self, suffix: str, labels: dict[str, str]) -> float:
        value = self.registry.get_sample_value(self.name + suffix, {k: str(v) for k, v in labels.items()})
        return float(value or 0.0)

    def expose(self) -> list[str]:
        """This registry's exposition lines (for a metric built on its own registry, just this metric)."""
        return generate_latest(self.registry).decode("utf-8").splitlines()


class Counter(_Metric):
    """A monotonically increasing count, optionally split by labels (``name`` ends in ``_total``)."""

    def __init__(self, name: str, help_: str, labelnames: Sequence[str] = (),
                 registry: CollectorRegistry | None = None) -> None:
        super().__init__(name, help_, labelnames, registry)
        self._metric = prometheus_client.Counter(name.removesuffix("_total"), help_, self.labelnames,
                                                 registry=self.registry)

    def inc(self, amount: float = 1.0, **labels: str) -> None:
        if amount < 0:
            raise ValueError(f"{self.name}: counters only go up (got {amount})")
        self._child(self._metric, labels).inc(amount)

    def value(self, **labels: str) -> float:
        self._child(self._metric, labels)  # checks the label names
        return self._sample("", labels)


class Histogram(_Metric):
    """Observed durations in cumulative buckets, plus their sum and count."""

    def __init__(
        self,
        name: str,
        help_: str,
        labelnames: Sequence[str] = (),
        buckets: Sequence[float] = DEFAULT_BUCKETS,
        registry: CollectorRegistry | None = None,
    ) -> None:
        super().__init__(name, help_, labelnames, registry)
        self._metric = prometheus_client.Histogram(name, help_, self.labelnames, buckets=tuple(buckets),
                                                   registry=self.registry)

    def observe(self, value: float, **labels: str) -> None:
        self._child(self._metric, labels).observe(value)

    @contextmanager
    def time(self, **labels: str) -> Iterator[None]:
        """Observe the wall-clock duration of the ``with`` block (also when it raises)."""
        with self._child(self._metric, labels).time():
            yield

    def count(self, **labels: str) -> int:
        return int(self._sample("_count", labels))

    def sum(self, **labels: str) -> float:
        return self._sample("_sum", labels)


class Metrics:
    """Every metric evident exports; build one per process and pass it to the components that count."""

    def __init__(self, buckets: Sequence[float] = DEFAULT_BUCKETS) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.questions = Counter("evident_questions_total", "Questions the engine answered, from any chat "
                                 "platform (Slack, Teams) or the CLI; requests per platform: "
                                 "evident_events_total.", registry=r)
        self.llm_calls = Counter("evident_llm_calls_total", "Requests sent to the LLM endpoint, by role.",
                                 ("role",), registry=r)
        self.llm_errors = Counter(
            "evident_llm_errors_total", "Failed LLM requests, by error kind.", ("kind",), registry=r
        )
        self.sync_pages = Counter("evident_sync_pages_total",
                                  "Pages handled by Confluence sync, by result (e.g. indexed, unchanged, "
                                  "deleted, failed).", ("result",), registry=r)
        self.sync_errors = Counter("evident_sync_errors_total", "Sync runs that failed.", registry=r)
        self.answer_seconds = Histogram("evident_answer_seconds", "Time from question to posted answer.",
                                        buckets=buckets, registry=r)
        self.explain_seconds = Histogram(
            "evident_explain_seconds",
            "Time to compute a causal explanation (attribution).",
            buckets=buckets,
            registry=r,
        )
        self.events = Counter("evident_events_total", "Requests received from a chat platform (events, "
                              "commands, actions, activities), by platform.", ("platform",), registry=r)
        self.connects = Counter("evident_transport_connects_total", "Connections a chat transport opened, by "
                                "platform (Slack Socket Mode: one per hello).", ("platform",), registry=r)
        self.reconnects = Counter(
            "evident_transport_reconnects_total",
            "Connections opened after the first one (a refresh or a dropped link), by platform.",
            ("platform",),
            registry=r,
        )
        self._event_age = prometheus_client.Gauge(
            "evident_seconds_since_last_event", "Seconds since the last request from a chat platform, by "
            "platform (absent until the first).", ("platform",), registry=r)
        self._last_event: dict[str, float] = {}
        self.loop_blocks = Counter("evident_event_loop_blocks_total", "Times the event loop was blocked for "
                                   "longer than EVIDENT_LOOP_WATCH_MS (each one also logged).", registry=r)
        prometheus_client.Gauge("evident_event_loop_tasks", "Tasks alive on the event loop (at scrape time).",
                                registry=r).set_function(_loop_tasks)

    def event_received(self, platform: str) -> None:
        """A chat platform delivered something: count it and restart its "seconds since" clock."""
        self.events.inc(platform=platform)
        if platform not in self._last_event:
            self._event_age.labels(platform=platform).set_function(
                lambda: self.seconds_since_event(platform) or 0.0
            )
        self._last_event[platform] = time.monotonic()

    def seconds_since_event(self, platform: str) -> float | None:
        last = self._last_event.get(platform)
        return None if last is None else time.monotonic() - last

    def transport_connected(self, platform: str) -> None:
        """A transport opened a connection; every one after the first is a reconnect."""
        if self.connects.value(platform=platform) >= 1:
            self.reconnects.inc(platform=platform)
        self.connects.inc(platform=platform)

    def render(self) -> str:
        """The text exposition format, served with ``CONTENT_TYPE``."""
        return generate_latest(self.registry).decode("utf-8")


def error_kind(exc: BaseException) -> str:
    """A small, stable label value for ``evident_llm_errors_total{kind}`` (never the message: cardinality)."""
    for cls, kind in (
        (RateLimitedError, "rate_limited"),
        (TransientError, "transient"),
        (AuthError, "auth"),
        (NotFoundError, "not_found"),
        (UnreachableError, "unreachable"),
        (RemoteError, "remote"),
        (EvidentError, "evident"),
    ):
        if isinstance(exc, cls):
            return kind
    return "other"


def _loop_tasks() -> float:
    """The running loop's live tasks; 0 when scraped outside one."""
    try:
        return float(len(asyncio.all_tasks()))
    except RuntimeError:
        return 0.0
