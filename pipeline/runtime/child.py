"""Worker processes of evident's own (the embedding model, the embedded index): start one on a socket pair,
stop it.

The child is ``python -m <module> <fd>`` with the repository on ``PYTHONPATH``, so nothing depends on how the
parent was started; it reads requests from the connection on that descriptor and exits when it closes.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
from collections.abc import Mapping
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any


def spawn_child(module: str, env: Mapping[str, str] | None = None
                ) -> tuple[subprocess.Popen[bytes], Connection]:
    """Start ``python -m module <fd>`` with ``env`` (default: this process's environment); return the process
    and the parent's end of the connection."""
    parent_sock, child_sock = socket.socketpair()
    root = str(Path(__file__).resolve().parents[2])  # the directory holding the pipeline package
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
    try:
        process = subprocess.Popen(
            [sys.executable, "-m", module, str(child_sock.fileno())],
            pass_fds=(child_sock.fileno(),), stdin=subprocess.DEVNULL,
            env={**(os.environ if env is None else env), "PYTHONPATH": path},
        )
    except BaseException:
        parent_sock.close()
        raise
    finally:
        child_sock.close()
    return process, Connection(parent_sock.detach())


def stop_child(conn: Connection | None, process: subprocess.Popen[bytes] | None, close: Any, *,
               reply_s: float = 0.0, exit_s: float = 10.0) -> None:
    """Send ``close``, wait up to ``reply_s`` for the child's answer and ``exit_s`` for it to exit, then kill
    it."""
    if conn is not None:
        with contextlib.suppress(OSError, EOFError):
            conn.send(close)
            if reply_s and conn.poll(reply_s):
                conn.recv()
        conn.close()
    if process is not None:
        try:
            process.wait(exit_s)
        except subprocess.TimeoutExpired:
            process.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):  # left to the kernel, never raised
                process.wait(5)
