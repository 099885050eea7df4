"""Pages prepared in a child process at a lower CPU priority (``ProcessPageWork``: ``evident serve``'s sync;
``EVIDENT_PAGE_PROCESS``).

The child is ``python -m pipeline.ingest.page_worker <fd>`` (``pipeline.runtime.child``, as the index worker
is): it lowers its own priority by ``EVIDENT_PAGE_PROCESS_NICE``, rebuilds the parent's BM25 encoder from
its parameters, and answers one ``prepare_page`` per request. On two cores the kernel then gives the CPU to
serve's event loop and index worker whenever a question needs it, which no thread of serve's own process can
be made to do. A page the child dies on, or that takes longer than its parse bound allows plus a margin,
fails alone with a one-line reason: the child is stopped and the next page starts a new one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import subprocess
import sys
import threading
from multiprocessing.connection import Connection

from pipeline.ingest.options import IngestOptions
from pipeline.ingest.page_work import Outcome, prepare_page
from pipeline.models.sparse import Bm25Encoder
from pipeline.protocols import SparseEncoder
from pipeline.runtime.child import spawn_child, stop_child
from pipeline.types import Page

log = logging.getLogger(__name__)
START_S = 60.0  # added to a page's deadline: the child's start-up (imports) on a busy machine


class ProcessPageWork:
    """``PageWork`` in one child process, started on the first page and kept for the next ones."""

    def __init__(self, sparse: SparseEncoder, *, nice: int) -> None:
        # BM25 pickles as its parameters, so a subclass would come back as a plain encoder: left to the caller
        self._spec = (sparse if type(sparse) is Bm25Encoder else None, nice)
        self._process: subprocess.Popen[bytes] | None = None
        self._conn: Connection | None = None
        self._io = threading.Lock()
        self.started = 0  # children started so far
        self._closed = False

    async def prepare(self, page: Page, options: IngestOptions, *, encode: bool, count: bool) -> Outcome:
        return await asyncio.to_thread(self._exchange, (page, options, encode, count),
                                       options.parse.timeout_s * 2 + START_S)

    def _exchange(self, request: tuple[Page, IngestOptions, bool, bool], deadline_s: float) -> Outcome:
        with self._io:
            if self._process is not None and self._process.poll() is not None:
                self._stop(exit_s=0)  # it died between pages (killed, say): this page goes to a new one
            if self._closed:
                return None, "the page worker was closed", 0.0
            if self._process is None:
                self._start()
            process, conn = self._process, self._conn  # ``close`` may take them away: this page then fails
            assert process is not None and conn is not None
            try:
                conn.send(request)
                if conn.poll(deadline_s):
                    reply: Outcome = conn.recv()
                    return reply
                self._stop(exit_s=0)
                why = f"preparing the page took over {deadline_s:.0f} s: its worker process was stopped"
                return None, why, deadline_s
            except (EOFError, OSError):
                self._stop(exit_s=5)
                return None, f"the page worker process died on this page (exit code {process.poll()})", 0.0

    def _start(self) -> None:
        process, conn = spawn_child("pipeline.ingest.page_worker")
        self._process, self._conn = process, conn
        self.started += 1
        conn.send(self._spec)
        log.info("page worker started (pid %d, nice +%d)", process.pid, self._spec[1])

    def _stop(self, exit_s: float) -> None:
        conn, process, self._conn, self._process = self._conn, self._process, None, None
        stop_child(conn, process, None, exit_s=exit_s)

    async def close(self) -> None:
        """Stop the child for good (it exits when its connection closes); a page being prepared fails."""
        self._closed = True
        await asyncio.to_thread(self._stop, 10.0)


def _serve(conn: Connection) -> None:  # pragma: no cover - runs in the child
    """The child: prepare pages until the parent closes the connection."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C and SIGTERM are the parent's; it closes us
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    spec = conn.recv()
    if spec is None:  # closed before it began
        return
    bm25, nice = spec
    with contextlib.suppress(OSError):
        os.nice(nice)
    while True:
        try:
            request = conn.recv()
        except (EOFError, OSError):
            break
        if request is None:
            break
        page, options, encode, count = request
        conn.send(prepare_page(page, options, encode=encode, bm25=bm25, count=count))


if __name__ == "__main__":  # pragma: no cover - the child process
    _serve(Connection(int(sys.argv[1])))
