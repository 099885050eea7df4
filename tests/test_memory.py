"""Freed memory given back to the OS after a burst of work in threads (pipeline/runtime/memory.py)."""

from __future__ import annotations

import platform
import sys
import threading

import pytest

from pipeline.runtime.memory import anonymous_mib, trim_heap


@pytest.mark.skipif(not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc",
                    reason="glibc's malloc_trim and Linux's /proc")
def test_memory_freed_in_worker_threads_goes_back_to_the_os() -> None:
    kept: list[list[bytes]] = []

    def burst() -> None:  # 25 MiB in 64 KiB blocks (below mmap's threshold: from the thread's arena)
        blocks = [bytes(64 * 1024) for _ in range(400)]
        kept.append(blocks[::50])  # a few survivors keep each heap from shrinking from its top

    threads = [threading.Thread(target=burst) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    before = anonymous_mib()
    assert trim_heap() and trim_heap()  # glibc here; harmless to repeat
    after = anonymous_mib()
    assert before is not None and after is not None
    assert before - after >= 10, (before, after)  # freed blocks between the survivors, returned
    assert sum(len(k) for k in kept) == 32
