"""Consistent backups of what evident cannot rebuild cheaply: the SQLite store and the vector index.

The store is copied with SQLite's online backup API, which yields a consistent snapshot even while the bot
writes. The embedded (Qdrant Edge) index is a directory copied as-is, so the caller must have flushed and
closed it first. A Qdrant *server* is snapshotted server-side (``create_snapshot``); the manifest records the
snapshot name. ``manifest.json`` lists every file with size and SHA-256 so ``restore`` can verify first.
``backup`` and ``restore`` do blocking file I/O; ``backup_data`` and ``restore_data`` run them in a worker
thread from the settings, holding the embedded index's lease.

Layout of a backup directory::

    manifest.json
    evident.db          SQLite store
    index/...           embedded index directory (when given)
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shutil
import sqlite3
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from pipeline.errors import IndexError_, InputError, StoreError
from pipeline.index.files import copy_index_files, swap_in
from pipeline.settings import PipelineSettings

MANIFEST = "manifest.json"
STORE_FILE = "evident.db"
INDEX_DIR = "index"
FORMAT_VERSION = 1


class SnapshotClient(Protocol):
    """The part of ``qdrant_client.QdrantClient`` a server snapshot needs."""

    def create_snapshot(self, collection_name: str, wait: bool = True, **kwargs: Any) -> Any: ...


@dataclass(frozen=True)
class FileEntry:
    path: str
    bytes: int
    sha256: str


@dataclass(frozen=True)
class Manifest:
    """What a backup holds; written as ``manifest.json``."""

    format_version: int
    created_at: str
    duration_s: float
    store: FileEntry
    index: list[FileEntry] = field(default_factory=list)
    qdrant_snapshot: dict[str, Any] | None = None

    @property
    def total_bytes(self) -> int:
        return self.store.bytes + sum(e.bytes for e in self.index)

    @classmethod
    def read(cls, path: Path) -> Manifest:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            return cls(format_version=int(data["format_version"]), created_at=str(data["created_at"]),
                       duration_s=float(data["duration_s"]), store=FileEntry(**data["store"]),
                       index=[FileEntry(**e) for e in data.get("index", [])],
                       qdrant_snapshot=data.get("qdrant_snapshot"))
        except FileNotFoundError as exc:
            raise InputError(f"{path.parent} is not a backup: no {MANIFEST}") from exc
        except (ValueError, KeyError, TypeError) as exc:
            raise InputError(f"{path} is not a valid backup manifest: {exc}") from exc


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _entry(path: Path, rel: str) -> FileEntry:
    return FileEntry(path=rel, bytes=path.stat().st_size, sha256=_sha256(path))


def index_files(dest: Path) -> list[FileEntry]:
    """The manifest entries of the index files a backup directory holds (none for a server index)."""
    root = dest / INDEX_DIR
    return [_entry(p, p.relative_to(root).as_posix()) for p in sorted(root.rglob("*")) if p.is_file()]


def _is_nonempty(path: Path) -> bool:
    if path.is_dir():
        return any(path.iterdir())
    return path.exists() and path.stat().st_size > 0


def _backup_sqlite(src: Path, dst: Path) -> None:
    if not src.is_file():
        raise StoreError(f"store not found: {src}")
    try:
        source = sqlite3.connect(src)
        try:
            target = sqlite3.connect(dst)
            try:
                source.backup(target)  # one step: a consistent snapshot even under concurrent writers
                check = target.execute("PRAGMA integrity_check").fetchone()[0]
            finally:
                target.close()
        finally:
            source.close()
    except sqlite3.Error as exc:
        raise StoreError(f"backup of {src} failed: {exc}") from exc
    if check != "ok":
        raise StoreError(f"backup of {src} failed the integrity check: {check}")


def backup(
    dest: Path,
    *,
    store_path: Path,
    index_dir: Path | None = None,
    qdrant: SnapshotClient | None = None,
    collection: str = "evident",
) -> Manifest:
    """Write a backup into ``dest`` (absent or empty) and return its manifest.

    ``index_dir``: the embedded index directory; the caller holds its lease (``pipeline.index.lease``), so no
    process has it open. ``qdrant``: a
    client for a Qdrant server; a server-side snapshot of ``collection`` is created and its name recorded
    (download it from the server's snapshot storage; TODO: fetch it into ``dest``).
    """
    dest = Path(dest)
    if _is_nonempty(dest):
        raise InputError(f"backup destination {dest} is not empty")
    if index_dir is not None and not Path(index_dir).is_dir():
        raise IndexError_(f"index directory not found: {index_dir}")
    started = time.monotonic()
    dest.mkdir(parents=True, exist_ok=True)
    _backup_sqlite(Path(store_path), dest / STORE_FILE)
    index_entries: list[FileEntry] = []
    if index_dir is not None:
        copy_index_files(index_dir, dest / INDEX_DIR)
    index_entries = index_files(dest)
    snapshot: dict[str, Any] | None = None
    if qdrant is not None:
        described = qdrant.create_snapshot(collection_name=collection, wait=True)
        if described is None:
            raise IndexError_(f"Qdrant did not create a snapshot of collection {collection!r}")
        snapshot = {
            "collection": collection,
            "name": getattr(described, "name", str(described)),
            "size": getattr(described, "size", None),
            "checksum": getattr(described, "checksum", None),
        }
    manifest = Manifest(
        format_version=FORMAT_VERSION,
        created_at=datetime.now(UTC).isoformat(timespec="seconds"),
        duration_s=round(time.monotonic() - started, 3),
        store=_entry(dest / STORE_FILE, STORE_FILE),
        index=index_entries,
        qdrant_snapshot=snapshot,
    )
    (dest / MANIFEST).write_text(json.dumps(asdict(manifest), indent=2) + "\n", encoding="utf-8")
    return manifest


def _verify(src: Path, manifest: Manifest) -> None:
    entries = [(src / manifest.store.path, manifest.store)]
    entries += [(src / INDEX_DIR / e.path, e) for e in manifest.index]
    for path, entry in entries:
        if not path.is_file():
            raise InputError(f"backup {src} is incomplete: {entry.path} is missing")
        if path.stat().st_size != entry.bytes or _sha256(path) != entry.sha256:
            raise InputError(f"backup {src} is corrupt: {entry.path} does not match its manifest")


def restore(src: Path, *, store_path: Path, index_dir: Path | None = None, force: bool = False) -> Manifest:
    """Bring a backup's store (and index, when it has one) back, verifying checksums first.

    Refuses to overwrite a non-empty store or index directory unless ``force``. The bot must be stopped:
    files are swapped in place, and a stale ``-wal``/``-shm`` beside the store is removed so SQLite cannot
    replay old writes onto the restored database.
    """
    src = Path(src)
    manifest = Manifest.read(src / MANIFEST)
    if manifest.format_version > FORMAT_VERSION:
        raise InputError(
            f"backup {src} has format {manifest.format_version}; this evident reads {FORMAT_VERSION}"
        )
    _verify(src, manifest)
    store_path = Path(store_path)
    restore_index = index_dir is not None and bool(manifest.index)
    targets = [store_path] + ([Path(index_dir)] if restore_index and index_dir is not None else [])
    if not force:
        busy = [str(p) for p in targets if _is_nonempty(p)]
        if busy:
            raise InputError(f"refusing to overwrite {', '.join(busy)}: pass force=True (--force)")

    store_path.parent.mkdir(parents=True, exist_ok=True)
    tmp_store = store_path.with_name(store_path.name + ".restoring")
    shutil.copyfile(src / STORE_FILE, tmp_store)
    for suffix in ("-wal", "-shm", "-journal"):
        store_path.with_name(store_path.name + suffix).unlink(missing_ok=True)
    os.replace(tmp_store, store_path)

    if restore_index and index_dir is not None:
        swap_in(src / INDEX_DIR, Path(index_dir))
    return manifest


# ---------------------------------------------------------------- from settings, holding the index lease


async def backup_data(settings: PipelineSettings, dest: Path) -> Manifest:
    """Back up the configured store and index: the index writes its own part (``Index.snapshot``: the embedded
    one copies its files under the lease, a server snapshots the collection server-side)."""
    from pipeline.factory import make_index_from

    dest = Path(dest)
    if _is_nonempty(dest):
        raise InputError(f"backup destination {dest} is not empty")
    started = time.monotonic()
    dest.mkdir(parents=True, exist_ok=True)
    await asyncio.to_thread(_backup_sqlite, settings.core.resolved_store_path, dest / STORE_FILE)
    index = make_index_from(settings)
    try:
        snapshot = await index.snapshot(dest / INDEX_DIR)
    finally:
        await index.close()
    return await asyncio.to_thread(_write_manifest, dest, started, snapshot)


def _write_manifest(dest: Path, started: float, snapshot: dict[str, Any]) -> Manifest:
    manifest = Manifest(
        format_version=FORMAT_VERSION,
        created_at=datetime.now(UTC).isoformat(timespec="seconds"),
        duration_s=round(time.monotonic() - started, 3),
        store=_entry(dest / STORE_FILE, STORE_FILE),
        index=index_files(dest),
        qdrant_snapshot=snapshot if snapshot.get("backend") == "qdrant" else None,
    )
    (dest / MANIFEST).write_text(json.dumps(asdict(manifest), indent=2) + "\n", encoding="utf-8")
    return manifest


async def restore_data(settings: PipelineSettings, src: Path, *, force: bool) -> Manifest:
    """Restore a backup into the configured store and index (after verifying it): the store here, the index's
    part by the index itself (``Index.restore``)."""
    from pipeline.factory import make_index_from

    manifest = await asyncio.to_thread(
        restore, src, store_path=settings.core.resolved_store_path, force=force
    )
    if manifest.index:
        index = make_index_from(settings)
        try:
            await index.restore(Path(src) / INDEX_DIR, force=force)
        finally:
            await index.close()
    return manifest
