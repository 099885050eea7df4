"""The embedded default ``Index``: Qdrant Edge, in-process, persisted to a directory.

Layout of ``path``: ``manifest.json`` (embedder, dimension, recipe; written atomically), ``shard/`` (the
Edge shard, laid out by ``EdgeLayout``) and ``pages.sqlite`` (the page table: ``edge_pages``). Edge keeps
the GIL while it works: calls go through ``asyncio.to_thread`` in batches of ``batch_size`` points, and a
serving process runs the whole index in a worker (``edge_worker.ProcessEdgeIndex``).

Atomic page swaps: a new page version is written ``staged`` (reads filter on ``state == live``), then one
critical section deletes the old live points and flips the new ones to live, so in-process readers see
the old or the new version, never a mix or a gap. Staged leftovers of a failed write are deleted by the
next ``replace_page`` of that page and by ``open``. Several processes share one directory: every public
operation runs inside ``SharedShard.use()`` (the directory's lease, handed over between operations), so
staged leftovers can only be a crashed writer's.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import qdrant_edge as qe

from pipeline.access.scope import PageAccess, acl_payload
from pipeline.errors import IndexError_, IndexMismatchError, InputError
from pipeline.index import common as ic
from pipeline.index.edge_layout import EdgeLayout
from pipeline.index.edge_manifest import (
    MANIFEST_FILE,
    SHARD_DIR,
    prepare_manifest,
    read_recipe,
    write_json_atomic,
)
from pipeline.index.edge_reads import EdgeReads
from pipeline.index.edge_records import match, match_any, scan_pages
from pipeline.index.files import copy_index_files, swap_in
from pipeline.runtime.memory import trim_heap
from pipeline.types import IndexPoint


class EdgeIndex(EdgeReads):
    """Hybrid index in a local directory via Qdrant Edge (``qdrant-edge-py``)."""

    batch_size: int = ic.WRITE_BATCH

    def __init__(self, path: Path, *, wait_s: float = 600.0, command: str | None = None,
                 layout: EdgeLayout | None = None) -> None:
        super().__init__(path, wait_s=wait_s, command=command, layout=layout)
        self._unoptimized = 0  # points written since the last optimize (segments are built as they fill)
        self._write_lock = asyncio.Lock()  # one writer at a time (staging cleanup vs. staging)

    # ------------------------------------------------------------------ open / close

    async def open(self, *, dense_dim: int, embedder: str, recipe: Mapping[str, Any] | None = None) -> None:
        """Create or load the shard; raise ``IndexMismatchError`` on another embedder, dimension or recipe.

        Waits (logging who holds it) while another process holds the index's lease.
        """
        self._sparse_idf = bool((recipe or {}).get("sparse_idf", True))
        await asyncio.to_thread(self._shared.open, lambda: self._open_sync(dense_dim, embedder, recipe),
                                self._reload)

    async def recipe(self) -> dict[str, Any] | None:
        """The recipe ``manifest.json`` records (see ``Index.recipe``)."""
        return await asyncio.to_thread(read_recipe, self._path)

    def _reload(self) -> qe.EdgeShard:
        """The shard again after a hand-over: the manifest was checked at ``open``."""
        shard = self._load_shard(self._dim, self._path / SHARD_DIR, has_manifest=True)
        self._after_load(shard)
        return shard

    def _config(self, dense_dim: int) -> qe.EdgeConfig:
        return self._layout.config(dense_dim, sparse_idf=self._sparse_idf)

    def _open_sync(
        self, dense_dim: int, embedder: str, recipe: Mapping[str, Any] | None = None
    ) -> qe.EdgeShard:
        self._path.mkdir(parents=True, exist_ok=True)
        manifest_path = self._path / MANIFEST_FILE
        shard_path = self._path / SHARD_DIR
        has_manifest = prepare_manifest(
            self._path, shard_path, embedder=embedder, dense_dim=dense_dim, recipe=recipe
        )
        shard = self._load_shard(dense_dim, shard_path, has_manifest=has_manifest, embedder=embedder)
        self._dim, self._embedder = dense_dim, embedder
        try:
            self._after_load(shard)
            if not has_manifest:
                write_json_atomic(manifest_path, ic.manifest(embedder, dense_dim, recipe))
        except BaseException:
            with contextlib.suppress(Exception):
                shard.close()
            raise
        return shard

    def _load_shard(
        self, dense_dim: int, shard_path: Path, *, has_manifest: bool, embedder: str = ""
    ) -> qe.EdgeShard:
        config = self._config(dense_dim)
        exists = shard_path.is_dir() and any(shard_path.iterdir())
        try:
            if exists:
                # Passing the config makes Edge check the stored vectors against it (a second guard
                # for shards whose manifest is missing).
                return qe.EdgeShard.load(str(shard_path), config)
            return qe.EdgeShard.create(str(shard_path), config)
        except Exception as exc:
            if "WouldBlock" in str(exc):
                raise IndexError_(
                    f"index at {self._path} is open in a process that does not take evident's lease "
                    "(an older evident?); stop it and retry"
                ) from exc
            if exists and not has_manifest:
                raise IndexMismatchError(
                    f"index at {self._path} has no manifest and does not match '{embedder}' (dim "
                    f"{dense_dim}): "
                    f"{exc}. Use another --index-dir or re-ingest with --rebuild"
                ) from exc
            raise IndexError_(f"cannot open qdrant edge shard at {shard_path}: {exc}") from exc

    def _after_load(self, shard: qe.EdgeShard) -> None:
        schema = self._call(lambda: shard.info().payload_schema)
        for name in ic.KEYWORD_FIELDS:
            if name not in schema:
                self._call(
                    shard.update, qe.UpdateOperation.create_field_index(name, qe.PayloadSchemaType.Keyword)
                )
        # Leftovers of a write that crashed while staging (no live process is mid-swap: see module doc).
        self._call(
            shard.update,
            qe.UpdateOperation.delete_points_by_filter(qe.Filter(must=[match(ic.STATE, ic.STAGED)])),
        )
        if not self._pages.open():
            self._pages.rebuild(scan_pages(lambda req: self._call(shard.scroll, req), self._live_filter()))

    async def close(self) -> None:
        """Flush and release the shard and the lease. Safe to call twice."""
        await asyncio.to_thread(self._close_sync)

    def _close_sync(self) -> None:
        try:
            self._shared.close()
        finally:
            self._pages.close()

    async def optimize(self) -> bool:
        """Merge segments, vacuum deleted points, build HNSW and quantization; ingest calls it at the end.

        Holds the GIL for seconds on large indexes: a serving process runs the index in a worker
        (``ProcessEdgeIndex``). Writes also call it each ``optimize_every_points`` (segments are built
        as they fill). Returns whether anything was optimized.
        """
        async with self._write_lock, self._shared.use():
            return await self._optimize_held()

    async def _optimize_held(self) -> bool:
        shard = self._require()
        self._unoptimized = 0
        changed = await asyncio.to_thread(self._call, shard.optimize)
        await asyncio.to_thread(self._call, shard.flush)
        if changed:
            await asyncio.to_thread(trim_heap)
        return changed

    async def snapshot(self, dest: Path) -> dict[str, object]:
        """Copy the index directory into ``dest`` (the lease held, the shard flushed and closed meanwhile);
        nothing when there is no index yet."""
        if not (self._path / MANIFEST_FILE).is_file():
            return {"backend": "qdrant-edge", "files": 0}
        files = await asyncio.to_thread(self._shared.exclusive, lambda: copy_index_files(self._path, dest))
        return {"backend": "qdrant-edge", "files": len(files)}

    async def restore(self, src: Path, *, force: bool = False) -> None:
        """Replace the index directory with the backed-up one at ``src`` (refused over an index unless
        ``force``)."""
        if (self._path / MANIFEST_FILE).is_file() and not force:
            raise InputError(f"refusing to overwrite the index at {self._path}: pass --force")
        await asyncio.to_thread(self._shared.exclusive, lambda: swap_in(src, self._path))

    async def drop(self) -> None:
        """Delete the shard and manifest (``--rebuild``), holding the lease throughout, then close.

        The index must be opened again afterwards.
        """
        async with self._write_lock:
            await asyncio.to_thread(self._shared.remove, self._drop_files)

    def _drop_files(self) -> None:
        self._pages.close()
        self._pages.remove_file()
        shutil.rmtree(self._path / SHARD_DIR, ignore_errors=True)
        (self._path / MANIFEST_FILE).unlink(missing_ok=True)

    # ------------------------------------------------------------------ writes

    async def replace_page(self, page_id: str, page_hash: str, points: Sequence[IndexPoint]) -> None:
        """Swap in a page version atomically (see module docstring); idempotent for the same hash."""
        async with self._write_lock, self._shared.use():
            live_hash = await asyncio.to_thread(self._begin_page_sync, page_id)
            # Same version again: ids collide with the live points, so rewrite them in place (the
            # content is identical by hash) and drop evidence no longer produced.
            in_place = live_hash == page_hash
            state = ic.LIVE if in_place else ic.STAGED
            new_ids: list[str] = []
            batch: list[IndexPoint] = []
            for point in points:
                ic.check_point(page_id, page_hash, point, self._dim)
                batch.append(point)
                if len(batch) >= self.batch_size:
                    new_ids += await asyncio.to_thread(self._upsert_sync, batch, state)
                    batch = []
            if batch:
                new_ids += await asyncio.to_thread(self._upsert_sync, batch, state)
            await asyncio.to_thread(
                self._swap_sync,
                page_id,
                new_ids,
                in_place,
                (page_hash if new_ids else None, points[0].evidence.space if points else ""),
            )
            self._unoptimized += len(new_ids)
            if self._unoptimized >= self._layout.optimize_every_points:
                await self._optimize_held()

    def _begin_page_sync(self, page_id: str) -> str | None:
        """Mark the page pending in the page table, drop its staged leftovers; return its live hash."""
        self._pages.mark_pending([page_id])
        staged = qe.Filter(must=[match("page_id", page_id), match(ic.STATE, ic.STAGED)])
        self._call(self._require().update, qe.UpdateOperation.delete_points_by_filter(staged))
        return self._live_version(page_id)[0]

    def _upsert_sync(self, batch: Sequence[IndexPoint], state: str) -> list[str]:
        shard = self._require()
        ids = [ic.point_id(p.evidence.id, p.page_hash) for p in batch]
        edge_points = [
            qe.Point(
                pid,
                {
                    ic.DENSE: [float(x) for x in p.dense],
                    ic.SPARSE: qe.SparseVector(list(p.sparse.indices), [float(v) for v in p.sparse.values]),
                },
                ic.to_payload(p, state),
            )
            for pid, p in zip(ids, batch, strict=True)
        ]
        self._call(shard.update, qe.UpdateOperation.upsert_points(edge_points))
        return ids

    def _swap_sync(
        self, page_id: str, new_ids: list[str], in_place: bool, settled: tuple[str | None, str]
    ) -> None:
        """Make the new points the live version, then settle the page table with ``settled`` (hash, space)."""
        shard = self._require()
        with self._shared.lock:  # one critical section: readers never observe the gap or a mix
            old: list[Any] = [match("page_id", page_id), match(ic.STATE, ic.LIVE)]
            if in_place:
                keep: list[Any] = [qe.HasIdCondition(set(new_ids))] if new_ids else []
                flt = qe.Filter(must=old, must_not=keep or None)
                self._call(shard.update, qe.UpdateOperation.delete_points_by_filter(flt))
            else:
                # Delete first: should the flip fail, the page is absent (the page table keeps it pending,
                # so the next sync re-ingests it) rather than mixed.
                self._call(shard.update, qe.UpdateOperation.delete_points_by_filter(qe.Filter(must=old)))
                if new_ids:
                    self._call(
                        shard.update, qe.UpdateOperation.set_payload(list(new_ids), {ic.STATE: ic.LIVE})
                    )
        self._pages.settle(page_id, *settled)

    async def set_access(self, pages: Mapping[str, PageAccess | None]) -> None:
        """Write who may read each page onto its points (live and staged): payload only, nothing
        re-embedded."""
        if not pages:
            return
        async with self._write_lock, self._shared.use():
            await asyncio.to_thread(self._set_access_sync, dict(pages))

    def _set_access_sync(self, pages: dict[str, PageAccess | None]) -> None:
        shard = self._require()
        for access, ids in ic.group_by_access(pages):
            flt = qe.Filter(must=[match_any("page_id", ids)])
            if access is None:
                op = qe.UpdateOperation.delete_payload_by_filter(flt, list(ic.ACL_FIELDS))
            else:
                op = qe.UpdateOperation.set_payload_by_filter(flt, acl_payload(access))
            self._call(shard.update, op)

    async def delete_pages(self, page_ids: Sequence[str]) -> None:
        """Remove pages (live and staged points)."""
        if not page_ids:
            return
        async with self._write_lock, self._shared.use():
            await asyncio.to_thread(self._delete_sync, list(page_ids))

    def _delete_sync(self, page_ids: list[str]) -> None:
        self._pages.mark_pending(page_ids)
        flt = qe.Filter(must=[match_any("page_id", page_ids)])
        self._call(self._require().update, qe.UpdateOperation.delete_points_by_filter(flt))
        self._pages.remove(page_ids)
