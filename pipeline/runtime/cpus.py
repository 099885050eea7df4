"""How many CPUs this process may use (its affinity mask, not the machine's count: a container or
``taskset`` may give it fewer)."""

from __future__ import annotations

import os


def available_cores() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)
