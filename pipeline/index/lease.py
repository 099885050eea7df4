"""One embedded index, several processes: a lease passed between them at operation boundaries.

Qdrant Edge lets one process open a shard (it locks the shard's WAL). evident's commands (``serve``,
``sync``, ``ingest``, ``search``, ``ask``, ``explain``) take turns instead of failing:

- The holder has an exclusive ``flock`` on ``DIR/lease.lock`` and says who it is in
  ``DIR/lease.owner`` (pid, command, since).
- A process that needs the index while it is held leaves a marker in ``DIR/lease.waiting/``, logs
  who holds it, and polls the lock.
- The holder checks for markers after every index operation (a search, one page write) and, while
  it idles, from a watcher thread. When someone waits and no operation is in flight, it flushes and
  closes its shard and releases the lock; its own next operation then waits for the lease in turn
  and lets the earlier waiters go first.

A wait therefore lasts about one operation of the other process, not its whole run. The cost is a
shard reopen per hand-over (tens of ms for a small index, more for a large one). Crashed holders
release the ``flock`` with their file descriptors; stale waiting markers of dead processes are
ignored.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from pipeline.errors import IndexBusyError

log = logging.getLogger("evident.index")

LOCK_FILE = "lease.lock"
OWNER_FILE = "lease.owner"
WAITING_DIR = "lease.waiting"
_POLL_S = 0.02
_HANDOVER_S = 5.0  # after yielding, let the waiters we yielded to go first for at most this long
_NOTICE_AFTER_S = 0.5
_NOTICE_EVERY_S = 30.0


def describe_process() -> str:
    """``evident ingest`` for ``/venv/bin/evident ingest docs/``: the program and its subcommand."""
    argv = sys.argv or ["python"]
    words = [Path(argv[0]).name, *[a for a in argv[1:] if not a.startswith("-")][:1]]
    return " ".join(words)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class IndexLease:
    """The lease on one index directory, as one process sees it (not thread-safe: its owner serializes)."""

    def __init__(self, directory: Path, *, command: str | None = None, wait_s: float = 600.0,
                 notify: Callable[[str], None] | None = None) -> None:
        self.directory = Path(directory)
        self.command = command or describe_process()
        self.wait_s = wait_s
        self._notify = notify or log.warning
        self._fd: int | None = None
        self._marker = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self._yielded_to: set[str] = set()
        self._yielded_at = 0.0

    @property
    def held(self) -> bool:
        return self._fd is not None

    # ------------------------------------------------------------------ acquire / release

    def acquire(self) -> None:
        """Block until the lease is ours (``IndexBusyError`` after ``wait_s``)."""
        if self._fd is not None:
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.directory / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            self._wait_for(fd)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        self._write_owner()

    def release(self, *, yielding: bool = False) -> None:
        """Give the lease up; ``yielding`` remembers who waited, so they go before our next acquire."""
        if self._fd is None:
            return
        if yielding:
            self._yielded_to = set(self._waiters())
            self._yielded_at = time.monotonic()
        fd, self._fd = self._fd, None
        try:
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def others_waiting(self) -> bool:
        return bool(self._waiters())

    def holder(self) -> str:
        """Who holds the lease, for messages: "`evident serve` (pid 12) since 10:04:01"."""
        try:
            info = json.loads((self.directory / OWNER_FILE).read_text(encoding="utf-8"))
            since = time.strftime("%H:%M:%S", time.localtime(float(info["since"])))
            return f"`{info['command']}` (pid {int(info['pid'])}) since {since}"
        except (OSError, ValueError, KeyError, TypeError):
            return "another process"

    # ------------------------------------------------------------------ internals

    def _wait_for(self, fd: int) -> None:
        if not self._handover_pending() and self._try_lock(fd):
            return
        marker = self.directory / WAITING_DIR / self._marker
        marker.parent.mkdir(exist_ok=True)
        marker.touch()
        start = time.monotonic()
        noticed = 0.0
        try:
            while True:
                if not self._handover_pending() and self._try_lock(fd):
                    return
                waited = time.monotonic() - start
                if waited >= self.wait_s:
                    raise IndexBusyError(
                        f"index at {self.directory} is in use by {self.holder()}; gave up after {waited:.0f} "
                        "s "
                        "(EVIDENT_INDEX_WAIT_S)"
                    )
                if waited >= _NOTICE_AFTER_S and (not noticed or waited - noticed >= _NOTICE_EVERY_S):
                    self._notify(f"waiting for the index at {self.directory}: in use by {self.holder()}")
                    noticed = waited
                time.sleep(_POLL_S)
        finally:
            marker.unlink(missing_ok=True)

    def _handover_pending(self) -> bool:
        if not self._yielded_to:
            return False
        if time.monotonic() - self._yielded_at > _HANDOVER_S or not (self._yielded_to & set(self._waiters())):
            self._yielded_to = set()
            return False
        return True

    @staticmethod
    def _try_lock(fd: int) -> bool:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except OSError as exc:
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                return False
            raise

    def _waiters(self) -> list[str]:
        try:
            names = os.listdir(self.directory / WAITING_DIR)
        except FileNotFoundError:
            return []
        out = []
        for name in names:
            if name == self._marker:
                continue
            pid = name.split("-", 1)[0]
            if pid.isdigit() and _alive(int(pid)):
                out.append(name)
            else:
                (self.directory / WAITING_DIR / name).unlink(missing_ok=True)
        return out

    def _write_owner(self) -> None:
        info = {"pid": os.getpid(), "command": self.command, "since": time.time()}
        tmp = self.directory / f".{OWNER_FILE}.{self._marker}"
        tmp.write_text(json.dumps(info), encoding="utf-8")
        os.replace(tmp, self.directory / OWNER_FILE)
