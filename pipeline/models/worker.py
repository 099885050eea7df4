"""An embedder in its own process: the model's runtime, threads and memory stay out of evident's process.

``ProcessEmbedder`` builds the real embedder (``make_embedder`` with the same arguments) in a child
process (``python -m pipeline.models.worker``, so nothing depends on how the parent was started) and
forwards ``embed_documents`` / ``embed_queries`` over a socket pair. Used for
the torch runtime (``EVIDENT_EMBED_PROCESS=auto``), because:

- torch and its OpenMP threads never share a GIL or cores' worth of spinning threads with the event loop
  of ``evident serve`` or with parsing during ingest;
- its memory (~320 MB: torch alone is ~220 MB) is the worker's, and the worker's heap is its own to
  fragment; evident's process holds pages, evidence and the index;
- a crash or an out-of-memory kill in the model fails one call with ``EmbeddingError``; the next call
  starts a new worker.

One request at a time (a lock): the model uses every core anyway. A long call (a sync's batch) goes in
chunks and a short one (a question) takes the next turn (``pipeline.models.turns``). Pipe messages are
pickles of the texts and of the float32 result.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Sequence
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

from pipeline.errors import ConfigError, EmbeddingError, EvidentError
from pipeline.models.turns import Turns
from pipeline.runtime.child import spawn_child, stop_child

_START_TIMEOUT_S = 300.0


def _serve(conn: Any, name: str, kwargs: dict[str, Any]) -> None:  # pragma: no cover - runs in the child
    """The child: build the embedder, report its identity, then answer requests until told to stop."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle; it closes us
    from pipeline.models.local import make_local_embedder

    try:
        embedder = make_local_embedder(name, **kwargs)
    except EvidentError as exc:
        conn.send(("error", type(exc).__name__, str(exc)))
        return
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which raises it there
        conn.send(("error", "EmbeddingError", f"{type(exc).__name__}: {exc}"))
        return
    turn_tokens = int(getattr(embedder, "turn_tokens", 0) or 0)  # 0: no chunks (the model does not say)
    conn.send(("ready", embedder.name, int(embedder.dim), int(getattr(embedder, "max_tokens", 0) or 0),
               turn_tokens))
    while True:
        try:
            op, texts = conn.recv()
        except (EOFError, OSError):
            break
        if op == "close":
            break
        try:
            vectors = embedder.embed_queries(texts) if op == "query" else embedder.embed_documents(texts)
            conn.send(("ok", np.ascontiguousarray(vectors, dtype=np.float32)))
        except EvidentError as exc:
            conn.send(("error", type(exc).__name__, str(exc)))
        except Exception as exc:  # noqa: BLE001 - one failed call, the worker lives on
            conn.send(("error", "EmbeddingError", f"{type(exc).__name__}: {exc}"))
    embedder.close()


class ProcessEmbedder:
    """The ``Embedder`` that ``make_embedder(name, **kwargs)`` would build, running in a child process."""

    def __init__(self, name: str, **kwargs: Any) -> None:
        self._spec = (name, kwargs)
        self._lock = threading.Lock()
        self._process: Any = None
        self._conn: Any = None
        self.restarts = 0
        self._closed = False
        self.name, self.dim, self.max_tokens, turn_tokens = self._start()
        self._turns = Turns(self.dim, self.max_tokens, turn_tokens or sys.maxsize)

    # ------------------------------------------------------------------ Embedder

    def embed_documents(self, texts: Sequence[str]) -> np.ndarray:
        return self._call("document", texts)

    def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        return self._call("query", texts)

    def close(self) -> None:
        """Stop the worker (idempotent); a call in flight fails at its next chunk instead of starting one."""
        with self._lock:
            self._closed = True
            self._stop()

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    # ------------------------------------------------------------------ internals

    def _start(self) -> tuple[str, int, int, int]:
        name, kwargs = self._spec
        process, conn = spawn_child("pipeline.models.worker")
        conn.send((name, kwargs))
        if not conn.poll(_START_TIMEOUT_S):
            process.kill()
            raise EmbeddingError(
                f"the embedding worker for {name!r} did not start within {_START_TIMEOUT_S:.0f} s"
            )
        try:
            reply = conn.recv()
        except EOFError:
            code = process.wait(10)
            raise EmbeddingError(
                f"the embedding worker for {name!r} exited at start-up (exit code {code})"
            ) from None
        if reply[0] == "error":
            process.wait(10)
            raise _error(reply[1], reply[2])
        self._process, self._conn = process, conn
        return str(reply[1]), int(reply[2]), int(reply[3]), int(reply[4])

    def _call(self, op: str, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        return self._turns.run(lambda part: self._request(op, part), texts)

    def _request(self, op: str, texts: Sequence[str]) -> np.ndarray:
        with self._lock:
            if self._closed:
                raise EmbeddingError("the embedding worker was closed")
            if self._conn is None:
                self._start()
                self.restarts += 1
            try:
                self._conn.send((op, list(texts)))
                reply = self._conn.recv()
            except (EOFError, OSError, BrokenPipeError):
                code = self._process.poll() if self._process is not None else None
                self._stop()
                raise EmbeddingError(f"the embedding worker died (exit code {code}); the next call starts "
                                     "a new one") from None
        if reply[0] == "error":
            raise _error(reply[1], reply[2])
        vectors: np.ndarray = reply[1]
        return vectors

    def _stop(self) -> None:
        conn, process, self._conn, self._process = self._conn, self._process, None, None
        stop_child(conn, process, ("close", None))


def _error(kind: str, message: str) -> EvidentError:
    """The child's error as the same class here (config and embedding errors; anything else embedding)."""
    return ConfigError(message) if kind == "ConfigError" else EmbeddingError(message)


if __name__ == "__main__":  # pragma: no cover - the child process
    _conn = Connection(int(sys.argv[1]))
    _name, _kwargs = _conn.recv()
    _serve(_conn, _name, _kwargs)
