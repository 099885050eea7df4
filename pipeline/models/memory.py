"""Keep a long-running model process's resident memory near what it really uses.

torch's CPU tensors come from glibc malloc. With length-bucketed batches every batch has other
tensor sizes, and glibc's heap then keeps growing with freed but unreturned chunks (measured: a
model that needs ~380 MB grew past 570 MB over 30 batches of varying shape, and ``malloc_trim``
gave all of it back). Trimming after every batch costs ~5-10 % throughput (pages fault in again),
so ``MemoryGuard`` trims only when resident memory has grown past a ceiling.
"""

from __future__ import annotations

import os

from pipeline.runtime.memory import libc_malloc_trim

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def rss_bytes() -> int:
    """Resident set size of this process (0 where /proc is unavailable)."""
    try:
        with open("/proc/self/statm", "rb") as fh:
            return int(fh.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return 0


class MemoryGuard:
    """``check()`` after each batch: returns freed heap to the OS once RSS exceeds baseline + slack."""

    def __init__(self, slack_bytes: int = 96 * 2**20) -> None:
        self._trim = libc_malloc_trim()
        self._slack = slack_bytes
        self._ceiling = 0
        self.trims = 0

    def reset(self) -> None:
        """Take the current RSS (after trimming) as the baseline, e.g. once a model is loaded."""
        if self._trim is not None:
            self._trim(0)
        base = rss_bytes()
        self._ceiling = base + self._slack if base else 0

    def check(self) -> None:
        if self._trim is None or not self._ceiling:
            return
        if rss_bytes() > self._ceiling:
            self._trim(0)
            self.trims += 1
