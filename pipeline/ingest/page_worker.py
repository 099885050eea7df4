"""Pages prepared in a child process at a lower CPU priority (``ProcessPageWork``: ``evident serve``'s sync;
``EVIDENT_PAGE_PROCESS``).

The child is ``python -m pipeline.ingest.page_worker <fd>`` (``pipeline.runtime.child``, as the index worker
is), started with only the environment Python needs (none of the bot's secrets) and at a priority lowered by
``EVIDENT_PAGE_PROCESS_NICE``; it rebuilds the parent's BM25 encoder from its parameters and answers one
``prepare_page`` per request. On two cores the kernel then gives the CPU to serve's event loop and index
worker whenever a question needs it, which no thread of serve's own process can be made to do.

A page the child dies on, or that takes more of the child's CPU time than twice its parse bound plus a minute
(CPU time, not wall time: the child is starved on purpose while questions are answered), fails alone with a
one-line reason; the child is stopped and the next page starts a new one. The worker is for priority, not
isolation: it runs the same parser as a thread would, and its replies are unpickled here.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import subprocess
import sys
import threading
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.ingest.page_work import Outcome, prepare_page
from pipeline.ingest.storage.clock import use_clock
from pipeline.models.sparse import Bm25Encoder
from pipeline.runtime.child import spawn_child, stop_child

if TYPE_CHECKING:
    from pipeline.ingest.options import IngestOptions
    from pipeline.protocols import SparseEncoder
    from pipeline.types import Page

log = logging.getLogger(__name__)
START_S = 60.0  # added to a page's CPU deadline: the child's start-up (imports)
WALL_FACTOR = 20  # the wall-clock bound, in CPU deadlines (where /proc cannot tell the CPU time)
_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "TMPDIR")  # what the child inherits
_Request = tuple["Page", "IngestOptions", bool, bool]


class ProcessPageWork:
    """``PageWork`` in one child process, started on the first page and kept for the next ones."""

    def __init__(self, sparse: SparseEncoder, *, nice: int) -> None:
        # BM25 pickles as its parameters, so a subclass would come back as a plain encoder: left to the caller
        self._bm25 = sparse if type(sparse) is Bm25Encoder else None
        self.nice = nice
        self._process: subprocess.Popen[bytes] | None = None
        self._conn: Connection | None = None
        self._io = threading.Lock()  # one exchange at a time; ``close`` waits for it after ending it
        self._closed = False
        self.started = 0  # children started so far

    async def prepare(self, page: Page, options: IngestOptions, *, encode: bool, count: bool) -> Outcome:
        return await asyncio.to_thread(self._exchange, (page, options, encode, count),
                                       options.parse.timeout_s * 2 + START_S)

    def _exchange(self, request: _Request, deadline_s: float) -> Outcome:
        with self._io:
            if self._process is not None and self._process.poll() is not None:
                self._stop(exit_s=0)  # it died between pages (killed, say): this page goes to a new one
            try:
                if self._process is None and not self._closed:
                    self._start()
                if self._closed or self._process is None or self._conn is None:
                    self._stop(exit_s=0)  # closed while it started: it has not begun its imports
                    return None, "the page worker was closed", 0.0
                return self._answer(self._process, self._conn, request, deadline_s)
            except (EOFError, OSError):
                code = _exit_code(self._process)
                self._stop(exit_s=5)
                if self._closed:
                    return None, "the page worker was closed", 0.0
                return None, f"the page worker process died on this page (exit code {code})", 0.0
            except Exception as exc:  # noqa: BLE001 - a start or a request that fails costs this page only
                self._stop(exit_s=0)
                return None, f"the page worker could not take the page ({type(exc).__name__}: {exc})", 0.0

    def _answer(self, process: subprocess.Popen[bytes], conn: Connection, request: _Request,
                deadline_s: float) -> Outcome:
        """Send ``request``; the reply, or a failure once the child has used ``deadline_s`` of CPU on it."""
        conn.send(request)
        used, sent = _cpu_s(process.pid), time.monotonic()
        step = max(0.05, min(1.0, deadline_s / 4))
        while not conn.poll(step):
            cpu, wall = _cpu_s(process.pid) - used, time.monotonic() - sent
            if cpu > deadline_s or wall > deadline_s * WALL_FACTOR:
                self._stop(exit_s=0)
                over = f"{deadline_s:g} s of CPU" if cpu > deadline_s else f"{wall:.0f} s"
                return None, f"preparing the page took over {over}: its worker was stopped", max(cpu, wall)
        reply: Outcome = conn.recv()
        return reply

    def _start(self) -> None:
        env = {k: os.environ[k] for k in _ENV if k in os.environ}
        process, conn = spawn_child("pipeline.ingest.page_worker", env=env)
        self._process, self._conn = process, conn
        self.started += 1
        try:  # from here, before its imports: the child itself may only raise its niceness
            lower = min(19, os.getpriority(os.PRIO_PROCESS, 0) + self.nice)
            os.setpriority(os.PRIO_PROCESS, process.pid, lower)
        except OSError as exc:
            log.warning("page worker: its priority stays as serve's (%s)", exc)
        conn.send(self._bm25)
        log.info("page worker started (pid %d, nice +%d)", process.pid, self.nice)

    def _stop(self, exit_s: float) -> None:
        conn, process, self._conn, self._process = self._conn, self._process, None, None
        stop_child(conn, process, None, exit_s=exit_s)

    async def close(self) -> None:
        """Stop the child for good; a page being prepared fails ("closed") and the exchange ends at once."""
        self._closed = True
        process = self._process
        if process is not None:
            with contextlib.suppress(OSError):
                process.kill()  # the exchange's wait wakes on the closed connection
        await asyncio.to_thread(self._close)

    def _close(self) -> None:
        with self._io:
            self._stop(exit_s=10)


def _exit_code(process: subprocess.Popen[bytes] | None) -> int | None:
    """The exit code of a child whose connection just closed (its exit may be a moment behind)."""
    if process is None:
        return None
    with contextlib.suppress(subprocess.TimeoutExpired):
        return process.wait(1)
    return None


def _cpu_s(pid: int) -> float:
    """CPU seconds process ``pid`` has used (user + system; 0 where /proc cannot tell: no deadline then)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return 0.0


def _serve(conn: Connection) -> None:  # pragma: no cover - runs in the child
    """The child: prepare pages until the parent closes the connection."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C and SIGTERM are the parent's; it closes us
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        bm25 = conn.recv()
    except (EOFError, OSError):
        return
    use_clock(time.process_time)  # the parse deadline in this process's CPU time: it is starved on purpose
    while True:
        try:
            request = conn.recv()
        except (EOFError, OSError):
            break
        if request is None:  # closed
            break
        page, options, encode, count = request
        started = time.perf_counter()
        try:
            reply = prepare_page(page, options, encode=encode, bm25=bm25, count=count)
            conn.send(reply)
        except (EOFError, OSError):
            break
        except Exception as exc:  # noqa: BLE001 - a reply that cannot be sent costs its page (no page text)
            why = f"the page worker failed ({type(exc).__name__})"
            with contextlib.suppress(EOFError, OSError):
                conn.send((None, why, time.perf_counter() - started))


if __name__ == "__main__":  # pragma: no cover - the child process
    _serve(Connection(int(sys.argv[1])))
