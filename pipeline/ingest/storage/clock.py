"""The clock a page's parse deadline is measured on (``EVIDENT_PAGE_TIMEOUT_S``)."""

from __future__ import annotations

import time
from collections.abc import Callable

_CLOCK: list[Callable[[], float]] = [time.monotonic]  # what ``use_clock`` set


def now() -> float:
    """The parse deadline's clock: wall time, except where ``use_clock`` changed it."""
    return _CLOCK[0]()


def use_clock(clock: Callable[[], float]) -> None:
    """Measure parse deadlines with ``clock`` from here on. Serve's page worker uses its own CPU time: it runs
    at a lower priority, starved on purpose while questions are answered, so wall time there would fail pages
    that a thread parses in time (``pipeline.ingest.page_worker``)."""
    _CLOCK[0] = clock
