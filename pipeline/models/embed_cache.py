"""A disk cache in front of any ``Embedder``, so re-ingests and eval ablations never embed a text twice.

Vectors live in one SQLite file (WAL, so several processes may share it) keyed by
(embedder name, max_tokens, side, sha1(text)); ``side`` separates documents from queries because
models such as e5 embed them with different prefixes. Only the missing texts reach the inner
embedder, in its own batches.

The table has rowids and a unique index on the key, in 16 KB pages: a 1.5 KB vector per row made the earlier
``WITHOUT ROWID`` table of 4 KB pages (``embeddings.sqlite``, moved over on first open) 3x as large on disk as
its vectors (229 MB for 49,000 of 384 dimensions, ``benchmarks/wiki_scale.py``), as SQLite's documentation
warns for large rows.
"""

from __future__ import annotations

import hashlib
import logging
import sqlite3
import threading
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

import numpy as np

from pipeline.errors import EmbeddingError
from pipeline.protocols import Embedder

_SCHEMA = """
CREATE TABLE IF NOT EXISTS vectors (
    model TEXT NOT NULL,
    max_tokens INTEGER NOT NULL,
    side TEXT NOT NULL,
    sha1 BLOB NOT NULL,
    vec BLOB NOT NULL
);
CREATE UNIQUE INDEX IF NOT EXISTS vectors_key ON vectors (sha1, side, model, max_tokens);
"""
_OLD_FILE = "embeddings.sqlite"  # the WITHOUT ROWID layout
log = logging.getLogger(__name__)
_LOOKUP_CHUNK = 500  # stays under SQLite's bound-parameter limit


class CachedEmbedder:
    """Wraps ``inner``; returns exactly what ``inner`` would, reading known vectors from disk.

    Safe to share between threads: the SQLite connection is guarded by a lock, while the inner
    model runs outside it.
    """

    FILE_NAME = "vectors.sqlite"

    def __init__(self, inner: Embedder, cache_dir: Path) -> None:
        self.inner = inner
        self.name: str = inner.name
        self.dim: int = inner.dim
        self.max_tokens = int(getattr(inner, "max_tokens", 0) or 0)
        self.path = Path(cache_dir) / self.FILE_NAME
        self.hits = 0
        self.misses = 0
        self._lock = threading.Lock()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(self.path, check_same_thread=False, timeout=30.0)
            self._db.execute("PRAGMA page_size=16384")  # a new file: ten 1.5 KB vectors a page, little slack
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.executescript(_SCHEMA)
            self._db.commit()
            self._move_old(self.path.with_name(_OLD_FILE))
        except (OSError, sqlite3.Error) as exc:
            raise EmbeddingError(f"cannot open the embedding cache {self.path}: {exc}") from exc

    def _move_old(self, old: Path) -> None:
        """Copy the vectors of a cache in the earlier layout into this one, then delete it."""
        if not old.exists():
            return
        try:
            self._db.execute("ATTACH DATABASE ? AS old", (str(old),))
            try:
                with self._db:
                    self._db.execute("INSERT OR IGNORE INTO vectors "
                                     "SELECT model, max_tokens, side, sha1, vec FROM old.vectors")
            finally:
                self._db.execute("DETACH DATABASE old")
        except sqlite3.Error as exc:
            if getattr(exc, "sqlite_errorname", "") not in ("SQLITE_NOTADB", "SQLITE_CORRUPT"):
                # busy, full, unreadable now: kept, and carried over at a later open
                log.warning("embedding cache %s not carried over yet (%s)", old, exc)
                return
            log.warning("embedding cache %s is damaged (%s): deleted", old, exc)  # embedded again as needed
        for leftover in (old, old.with_name(old.name + "-wal"), old.with_name(old.name + "-shm")):
            leftover.unlink(missing_ok=True)

    def embed_documents(self, texts: Sequence[str]) -> np.ndarray:
        return self._embed(texts, "doc")

    def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        return self._embed(texts, "query")

    def __len__(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT count(*) FROM vectors").fetchone()[0])

    def close(self) -> None:
        """Close the cache and the model it wraps (when that holds resources of its own)."""
        with self._lock:
            self._db.close()
        self.inner.close()

    def __enter__(self) -> CachedEmbedder:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # ------------------------------------------------------------------ internals

    def _embed(self, texts: Sequence[str], side: str) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        if not texts:
            return out
        keys = [hashlib.sha1(t.encode("utf-8")).digest() for t in texts]
        found = self._lookup(sorted(set(keys)), side)
        missing: dict[bytes, int] = {}  # key -> first position, so duplicates embed once
        for pos, key in enumerate(keys):
            vec = found.get(key)
            if vec is not None:
                out[pos] = vec
            elif key not in missing:
                missing[key] = pos
        self.hits += len(texts) - sum(1 for k in keys if k in missing)
        self.misses += len(missing)
        if missing:
            todo = list(missing.items())
            batch = [texts[pos] for _, pos in todo]
            fresh = self.inner.embed_documents(batch) if side == "doc" else self.inner.embed_queries(batch)
            fresh = np.asarray(fresh, dtype=np.float32).reshape(len(batch), self.dim)
            self._store([(key, fresh[i]) for i, (key, _) in enumerate(todo)], side)
            new = {key: fresh[i] for i, (key, _) in enumerate(todo)}
            for pos, key in enumerate(keys):
                if key in new:
                    out[pos] = new[key]
        return out

    def _lookup(self, keys: list[bytes], side: str) -> dict[bytes, np.ndarray]:
        found: dict[bytes, np.ndarray] = {}
        with self._lock:
            try:
                for start in range(0, len(keys), _LOOKUP_CHUNK):
                    chunk = keys[start : start + _LOOKUP_CHUNK]
                    marks = ",".join("?" * len(chunk))
                    rows = self._db.execute(
                        f"SELECT sha1, vec FROM vectors WHERE model=? AND max_tokens=? AND side=? "
                        f"AND sha1 IN ({marks})",
                        (self.name, self.max_tokens, side, *chunk),
                    ).fetchall()
                    for key, blob in rows:
                        vec = np.frombuffer(blob, dtype=np.float32)
                        if vec.shape[0] == self.dim:  # a stale entry of another width is a miss
                            found[bytes(key)] = vec
            except sqlite3.Error as exc:
                raise EmbeddingError(f"embedding cache read failed ({self.path}): {exc}") from exc
        return found

    def _store(self, items: list[tuple[bytes, np.ndarray]], side: str) -> None:
        rows = [
            (self.name, self.max_tokens, side, key, np.ascontiguousarray(vec, dtype=np.float32).tobytes())
            for key, vec in items
        ]
        with self._lock:
            try:
                with self._db:
                    self._db.executemany("INSERT OR REPLACE INTO vectors VALUES (?, ?, ?, ?, ?)", rows)
            except sqlite3.Error as exc:
                raise EmbeddingError(f"embedding cache write failed ({self.path}): {exc}") from exc
