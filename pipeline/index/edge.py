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
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import qdrant_edge as qe

from pipeline.errors import IndexError_, IndexMismatchError
from pipeline.index import common as ic
from pipeline.index.edge_layout import EdgeLayout, trim_heap
from pipeline.index.edge_manifest import MANIFEST_FILE, SHARD_DIR, prepare_manifest, write_json_atomic
from pipeline.index.edge_pages import PageTable
from pipeline.index.edge_records import match as _match
from pipeline.index.edge_records import match_any as _match_any
from pipeline.index.edge_records import scan_pages
from pipeline.index.shared_shard import SharedShard
from pipeline.types import EVIDENCE_KINDS, Evidence, Hit, IndexPoint, SearchRequest

T = TypeVar("T")


class EdgeIndex:
    """Hybrid index in a local directory via Qdrant Edge (``qdrant-edge-py``)."""

    batch_size: int = ic.WRITE_BATCH

    def __init__(
        self,
        path: Path,
        *,
        wait_s: float = 600.0,
        command: str | None = None,
        layout: EdgeLayout | None = None,
    ) -> None:
        self._path = Path(path)
        self._layout = layout or EdgeLayout()
        self._pages = PageTable(self._path)  # page_id -> (hash, space), read by every sync
        self._shared = SharedShard(self._path, wait_s=wait_s, command=command)
        self._dim = 0
        self._embedder = ""
        self._sparse_idf = True  # from the recipe: BM25 needs IDF, learned sparse weights (bge-m3) do not
        self._unoptimized = 0  # points written since the last optimize (segments are built as they fill)
        self._write_lock = asyncio.Lock()  # one writer at a time (staging cleanup vs. staging)

    @property
    def path(self) -> Path:
        return self._path

    @property
    def handovers(self) -> int:  # how often this process handed the shard to another one
        return self._shared.handovers

    def _require(self) -> qe.EdgeShard:
        return self._shared.current

    def _call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run one Edge call under the lock, turning its errors into ``IndexError_``."""
        with self._shared.lock:
            try:
                return fn(*args)
            except Exception as exc:
                raise IndexError_(f"qdrant edge at {self._path}: {exc}") from exc

    def _live_filter(self, spaces: Sequence[str] | None = None) -> qe.Filter:
        must: list[Any] = [_match(ic.STATE, ic.LIVE)]
        if spaces is not None:
            must.append(_match_any("space", spaces))
        return qe.Filter(must=must)

    # ------------------------------------------------------------------ open / close

    async def open(self, *, dense_dim: int, embedder: str, recipe: Mapping[str, Any] | None = None) -> None:
        """Create or load the shard; raise ``IndexMismatchError`` on another embedder, dimension or recipe.

        Waits (logging who holds it) while another process holds the index's lease.
        """
        self._sparse_idf = bool((recipe or {}).get("sparse_idf", True))
        await asyncio.to_thread(self._shared.open, lambda: self._open_sync(dense_dim, embedder, recipe),
                                self._reload)

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
            qe.UpdateOperation.delete_points_by_filter(qe.Filter(must=[_match(ic.STATE, ic.STAGED)])),
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
        staged = qe.Filter(must=[_match("page_id", page_id), _match(ic.STATE, ic.STAGED)])
        self._call(self._require().update, qe.UpdateOperation.delete_points_by_filter(staged))
        return self._live_version_sync(page_id)[0]

    def _live_version_sync(self, page_id: str) -> tuple[str | None, str]:
        """The page's live hash (None: no live points) and space, from the shard."""
        shard = self._require()
        flt = qe.Filter(must=[_match("page_id", page_id), _match(ic.STATE, ic.LIVE)])
        selector = qe.PayloadSelector.Include(["page_hash", "space"])
        records, _ = self._call(shard.scroll, qe.ScrollRequest(limit=1, filter=flt, with_payload=selector))
        if not records or not records[0].payload:
            return None, ""
        return str(records[0].payload["page_hash"]), str(records[0].payload.get("space") or "")

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
            old: list[Any] = [_match("page_id", page_id), _match(ic.STATE, ic.LIVE)]
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

    async def delete_pages(self, page_ids: Sequence[str]) -> None:
        """Remove pages (live and staged points)."""
        if not page_ids:
            return
        async with self._write_lock, self._shared.use():
            await asyncio.to_thread(self._delete_sync, list(page_ids))

    def _delete_sync(self, page_ids: list[str]) -> None:
        self._pages.mark_pending(page_ids)
        flt = qe.Filter(must=[_match_any("page_id", page_ids)])
        self._call(self._require().update, qe.UpdateOperation.delete_points_by_filter(flt))
        self._pages.remove(page_ids)

    # ------------------------------------------------------------------ reads

    async def search(self, request: SearchRequest) -> list[Hit]:
        """Lexical, dense, or hybrid (RRF fused inside Edge, weighted when ``request.weights``)."""
        async with self._shared.use():
            return await asyncio.to_thread(self._search_sync, request)

    def _search_sync(self, request: SearchRequest) -> list[Hit]:
        shard = self._require()
        use_sparse, use_dense = ic.query_legs(request)
        if not (use_sparse or use_dense) or request.limit <= 0:
            return []
        flt = self._live_filter(request.spaces)
        # IDF over live points only, so staged versions never shift lexical scores.
        sparse_params = (
            qe.SearchParams(idf=qe.IdfParams(corpus=self._live_filter())) if self._sparse_idf else None
        )
        legs: list[tuple[Any, int, qe.SearchParams | None]] = []
        if use_sparse and request.sparse is not None:
            vec = qe.SparseVector(list(request.sparse.indices), [float(v) for v in request.sparse.values])
            legs.append((qe.Query.Nearest(vec, using=ic.SPARSE), request.lexical_k, sparse_params))
        if use_dense and request.dense is not None:
            dense_params = self._layout.dense_params()
            legs.append(
                (
                    qe.Query.Nearest([float(x) for x in request.dense], using=ic.DENSE),
                    request.dense_k,
                    dense_params,
                )
            )
        if request.mode != "hybrid":
            query, _, params = legs[0]
            req = qe.QueryRequest(
                limit=request.limit, query=query, filter=flt, params=params, with_payload=True
            )
        else:
            prefetches = [qe.Prefetch(limit=k, query=q, filter=flt, params=p) for q, k, p in legs]
            fusion: Any = qe.Fusion.Dbsf() if request.fusion == "dbsf" else qe.Fusion.Rrf(  # stubs omit Rrf
                k=ic.engine_rrf_k(request.rrf_k), weights=ic.leg_weights(request, use_sparse, use_dense)
            )
            req = qe.QueryRequest(
                limit=request.limit, prefetches=prefetches, query=fusion, filter=flt, with_payload=True
            )
        scored = ic.stable_order(list(self._call(shard.query, req)))
        return [
            Hit(
                ic.evidence_from_payload(p.payload or {}),
                float(p.score),
                rank,
                str((p.payload or {}).get("content", "")),
            )
            for rank, p in enumerate(scored, start=1)
        ]

    async def page_hashes(self) -> dict[str, str]:
        async with self._shared.use():
            return await asyncio.to_thread(self._page_hashes_sync)

    def _page_hashes_sync(self) -> dict[str, str]:
        return self._page_column_sync("hash")

    async def page_spaces(self) -> dict[str, str]:
        async with self._shared.use():
            return await asyncio.to_thread(self._page_column_sync, "space")

    def _page_column_sync(self, column: str) -> dict[str, str]:
        """From the page table, after settling pages a crashed write left pending (see ``edge_pages``)."""
        with self._shared.lock:
            for page_id in self._pages.pending():
                page_hash, space = self._live_version_sync(page_id)
                self._pages.settle(page_id, page_hash, space)
            return self._pages.column(column)

    async def export_points(
        self, batch: int = 256, *, page_ids: Sequence[str] | None = None
    ) -> AsyncIterator[IndexPoint]:
        """Every live point (of ``page_ids``, default all) with its vectors; a page's points are consecutive.

        For ``evident index migrate``: the consumer can ``replace_page`` each page as it completes while
        holding only one page in memory. Each scroll of ``batch`` points is one short thread hop; run it
        on an index nobody writes to, or a page swapped meanwhile may be exported old or new.
        """
        pages = sorted(await self.page_hashes()) if page_ids is None else list(page_ids)
        for page_id in pages:
            offset: Any = None
            while True:
                async with self._shared.use():
                    points, offset = await asyncio.to_thread(
                        self._export_sync, page_id, offset, max(1, batch)
                    )
                for point in points:
                    yield point
                if offset is None:
                    break

    def _export_sync(self, page_id: str, offset: Any, batch: int) -> tuple[list[IndexPoint], Any]:
        shard = self._require()
        flt = qe.Filter(must=[_match("page_id", page_id), _match(ic.STATE, ic.LIVE)])
        req = qe.ScrollRequest(offset=offset, limit=batch, filter=flt, with_payload=True, with_vector=True)
        records, next_offset = self._call(shard.scroll, req)
        return [ic.point_from_record(r) for r in records], next_offset

    async def get(self, evidence_ids: Sequence[str]) -> list[Evidence]:
        """Live evidence by id, in the given order; unknown ids are skipped."""
        if not evidence_ids:
            return []
        async with self._shared.use():
            return await asyncio.to_thread(self._get_sync, list(evidence_ids))

    def _get_sync(self, evidence_ids: list[str]) -> list[Evidence]:
        shard = self._require()
        flt = qe.Filter(must=[_match(ic.STATE, ic.LIVE), _match_any("evidence_id", evidence_ids)])
        found: dict[str, Evidence] = {}
        offset: Any = None
        while True:
            req = qe.ScrollRequest(
                offset=offset, limit=max(len(evidence_ids), 16), filter=flt, with_payload=True
            )
            records, offset = self._call(shard.scroll, req)
            for r in records:
                ev = ic.evidence_from_payload(r.payload or {})
                found[ev.id] = ev
            if offset is None:
                break
        return [found[i] for i in evidence_ids if i in found]

    async def count(self) -> int:
        """Live points."""
        async with self._shared.use():
            return await asyncio.to_thread(self._count_sync, self._live_filter())

    def _count_sync(self, flt: qe.Filter) -> int:
        return self._call(self._require().count, qe.CountRequest(exact=True, filter=flt))

    async def ready(self) -> None:
        await self.count()

    async def stats(self) -> dict[str, object]:
        async with self._shared.use():
            return await asyncio.to_thread(self._stats_sync)

    def _stats_sync(self) -> dict[str, object]:
        shard = self._require()
        live = _match(ic.STATE, ic.LIVE)
        by_kind = {k: self._count_sync(qe.Filter(must=[live, _match("kind", k)])) for k in EVIDENCE_KINDS}
        info = self._call(shard.info)
        return {
            "backend": "qdrant-edge",
            "path": str(self._path),
            "points": self._count_sync(self._live_filter()),
            "pages": len(self._page_hashes_sync()),
            "by_kind": by_kind,
            "staged": self._count_sync(qe.Filter(must=[_match(ic.STATE, ic.STAGED)])),
            "segments": info.segments_count,
            "disk_bytes": sum(
                f.stat().st_blocks * 512 for f in (self._path / SHARD_DIR).rglob("*") if f.is_file()
            ),
            "embedder": self._embedder,
            "dim": self._dim,
        }
