"""Freed memory given back to the operating system after a burst of work.

glibc's ``malloc`` keeps what a process frees for reuse, per arena, and each thread that allocates may get
an arena of its own. serve's sync cycle parses, decodes and embeds in worker threads, so each cycle left
its peak in another arena: in a 12-minute soak (2,000 pages, a cycle every 2 minutes) serve's anonymous
memory grew 236 → 338 → 406 → 469 → 523 MiB, one step a cycle. With ``malloc_trim(0)`` after each cycle it
stayed at 278–294 MiB after the first. The embedded index trims after a segment build, and the model's
worker process when its memory passes a ceiling (``pipeline.models.memory``), for the same reason.
Elsewhere (musl, macOS) this is a no-op.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from collections.abc import Callable
from pathlib import Path


@functools.cache
def libc_malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim`` (looked up once), or None where the C library has none (musl, macOS)."""
    for name in ("libc.so.6", None):  # glibc's soname first; else ask ctypes (it may run ldconfig)
        name = name or ctypes.util.find_library("c")
        if not name:
            continue
        try:
            trim = ctypes.CDLL(name).malloc_trim
        except (OSError, AttributeError):  # no such library, or one without malloc_trim
            continue
        trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
        return trim  # type: ignore[no-any-return]
    return None


def anonymous_mib() -> float | None:
    """This process's anonymous resident memory in MiB (Linux), else None."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def trim_heap() -> bool:
    """Give every malloc arena's free memory back to the OS; False where the C library cannot. Blocking (a
    few milliseconds): call it off the event loop."""
    trim = libc_malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
