"""The reading half of the embedded index: searches, page tables, evidence by id, counts, exports.

Each public method is written once, as the blocking Qdrant Edge call it is; ``in_shard`` turns it into the
async method of the ``Index`` protocol (a worker thread, the shard held for the call).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import qdrant_edge as qe

from pipeline.access.scope import EVERYONE, AccessScope
from pipeline.errors import IndexError_
from pipeline.index import common as ic
from pipeline.index.edge_layout import EdgeLayout
from pipeline.index.edge_manifest import SHARD_DIR
from pipeline.index.edge_pages import PageTable
from pipeline.index.edge_records import match, match_any
from pipeline.index.shared_shard import SharedShard, in_shard
from pipeline.types import EVIDENCE_KINDS, Evidence, Hit, IndexPoint, SearchRequest

T = TypeVar("T")


class EdgeShardAccess:
    """The shard of one index directory and the helpers every operation on it uses."""

    def __init__(self, path: Path, *, wait_s: float = 600.0, command: str | None = None,
                 layout: EdgeLayout | None = None) -> None:
        self._path = Path(path)
        self._layout = layout or EdgeLayout()
        self._pages = PageTable(self._path)  # page_id -> (hash, space), read by every sync
        self._shared = SharedShard(self._path, wait_s=wait_s, command=command)
        self._dim = 0
        self._embedder = ""
        self._sparse_idf = True  # from the recipe: BM25 needs IDF, learned sparse weights (bge-m3) do not

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

    def _live_filter(self, scope: AccessScope | None = None) -> qe.Filter:
        """Live points, within ``scope`` (its spaces and readers) when one is given."""
        must: list[Any] = [match(ic.STATE, ic.LIVE)]
        must.extend(match_any(key, values) for key, values in (scope.conditions() if scope else ()))
        must.extend(qe.Filter(should=[qe.IsEmptyCondition(f), match_any(f, [EVERYONE])])
                    for f in (scope.open_fields() if scope else ()))
        return qe.Filter(must=must)

    def _live_version(self, page_id: str) -> tuple[str | None, str]:
        """The page's live hash (None: no live points) and space, from the shard."""
        flt = qe.Filter(must=[match("page_id", page_id), match(ic.STATE, ic.LIVE)])
        selector = qe.PayloadSelector.Include(["page_hash", "space"])
        records, _ = self._call(
            self._require().scroll, qe.ScrollRequest(limit=1, filter=flt, with_payload=selector)
        )
        if not records or not records[0].payload:
            return None, ""
        return str(records[0].payload["page_hash"]), str(records[0].payload.get("space") or "")

    def _count_where(self, flt: qe.Filter) -> int:
        return self._call(self._require().count, qe.CountRequest(exact=True, filter=flt))

    def _page_column(self, column: str) -> dict[str, str]:
        """From the page table, after settling pages a crashed write left pending (see ``edge_pages``)."""
        with self._shared.lock:
            for page_id in self._pages.pending():
                page_hash, space = self._live_version(page_id)
                self._pages.settle(page_id, page_hash, space)
            return self._pages.column(column)


class EdgeReads(EdgeShardAccess):
    @in_shard
    def search(self, request: SearchRequest) -> list[Hit]:
        return self._search(request)

    @in_shard
    def search_many(self, requests: Sequence[SearchRequest]) -> list[list[Hit]]:
        """The searches in one hold of the shard (no other operation between them).

        A hybrid search whose rankers the batch also asks alone (a question's search beside its confidence
        legs) runs each ranker once: the lone requests take the top of its list, and the hybrid fuses the
        lists here with the engine's formula (``ic.fuse_hits``). Fused in the engine,
        each ranker ran twice: on a 53,622-page index 73 ms a question's batch against 38 (BENCHMARKS.md).
        Equal scores within a ranker are ordered by evidence id here (the engine leaves their order open). A
        lone dense request's top hits come from the deeper search, whose quantized candidates are rescored
        more widely, so on built segments they can differ from its own search's (they are closer to exact).
        """
        shared = _shared_legs(requests)
        lists: dict[tuple[Any, ...], list[Any]] = {}
        return [self._search(r, shared, lists) for r in requests]

    def _search(self, request: SearchRequest, shared: Mapping[tuple[Any, ...], int] | None = None,
                lists: dict[tuple[Any, ...], list[Any]] | None = None) -> list[Hit]:
        """Lexical, dense, or hybrid (fused inside Edge: DBSF, or RRF weighted by ``request.weights``);
        the rankers in ``shared`` (ranker -> depth) run once into ``lists`` (see ``search_many``)."""
        use_sparse, use_dense = ic.query_legs(request)
        if not (use_sparse or use_dense) or request.limit <= 0:
            return []
        flt = self._live_filter(request.scope)
        legs = self._legs(request, use_sparse, use_dense, flt)
        if shared and lists is not None:
            found = self._from_shared(request, legs, flt, shared, lists)
            if found is not None:
                return found
        if request.mode != "hybrid":
            query, _, params = legs[0]
            req = qe.QueryRequest(
                limit=request.limit, query=query, filter=flt, params=params, with_payload=True
            )
        else:
            prefetches = [qe.Prefetch(limit=k, query=q, filter=flt, params=p) for q, k, p in legs]
            fusion: Any = qe.Fusion.Dbsf() if request.fusion == "dbsf" else qe.Fusion.Rrf(  # stubs omit Rrf
                k=ic.engine_rrf_k(request.rrf_k), weights=ic.leg_weights(request, use_sparse, use_dense))
            req = qe.QueryRequest(limit=request.limit, prefetches=prefetches, query=fusion, filter=flt,
                                  with_payload=True)
        return _hits(ic.stable_order(list(self._call(self._require().query, req))))

    def _from_shared(self, request: SearchRequest, legs: list[tuple[Any, int, qe.SearchParams | None]],
                     flt: qe.Filter, shared: Mapping[tuple[Any, ...], int],
                     lists: dict[tuple[Any, ...], list[Any]]) -> list[Hit] | None:
        """The request from its rankers' shared lists; None where it shares none (``search_many``)."""
        rankers = [ranker for ranker, _ in _rankers(request)]
        if request.mode != "hybrid":
            depth = shared.get(rankers[0])
            if depth is None or request.limit > depth:
                return None
            query, _, params = legs[0]
            return _hits(self._leg_list(rankers[0], (query, depth, params), flt, lists)[: request.limit])
        if not any(shared.get(ranker) == k for ranker, (_, k, _) in zip(rankers, legs, strict=True)):
            return None
        ranked = [self._leg_list(ranker, leg, flt, lists) for ranker, leg in zip(rankers, legs, strict=True)]
        return ic.fuse_hits([_hits(leg) for leg in ranked], request,
                            ic.leg_weights(request, *ic.query_legs(request)))

    def _leg_list(self, ranker: tuple[Any, ...], leg: tuple[Any, int, qe.SearchParams | None],
                  flt: qe.Filter, lists: dict[tuple[Any, ...], list[Any]]) -> list[Any]:
        """One ranker's scored points to ``leg``'s depth (a hybrid's prefetch alone), once a batch."""
        query, k, params = leg
        if (ranker, k) not in lists:
            req = qe.QueryRequest(limit=k, query=query, filter=flt, params=params, with_payload=True)
            lists[(ranker, k)] = ic.stable_order(list(self._call(self._require().query, req)))
        return lists[(ranker, k)]

    def _legs(self, request: SearchRequest, use_sparse: bool, use_dense: bool,
              flt: qe.Filter) -> list[tuple[Any, int, qe.SearchParams | None]]:
        legs: list[tuple[Any, int, qe.SearchParams | None]] = []
        if use_sparse and request.sparse is not None:
            # IDF over live points only, so staged versions never shift lexical scores.
            idf = qe.SearchParams(idf=qe.IdfParams(corpus=self._live_filter())) if self._sparse_idf else None
            vec = qe.SparseVector(list(request.sparse.indices), [float(v) for v in request.sparse.values])
            legs.append((qe.Query.Nearest(vec, using=ic.SPARSE), request.lexical_k, idf))
        if use_dense and request.dense is not None:
            dense = qe.Query.Nearest([float(x) for x in request.dense], using=ic.DENSE)
            legs.append((dense, request.dense_k, self._layout.dense_params()))
        return legs

    @in_shard
    def page_hashes(self) -> dict[str, str]:
        return self._page_column("hash")

    @in_shard
    def page_spaces(self) -> dict[str, str]:
        return self._page_column("space")

    @in_shard
    def get(self, evidence_ids: Sequence[str], scope: AccessScope) -> list[Evidence]:
        """Live evidence by id visible in ``scope``, in the given order; unknown or hidden ids are skipped."""
        ids = list(evidence_ids)
        if not ids:
            return []
        flt = self._live_filter(scope)
        flt = qe.Filter(must=[*(flt.must or []), match_any("evidence_id", ids)])
        found: dict[str, Evidence] = {}
        offset: Any = None
        while True:
            req = qe.ScrollRequest(offset=offset, limit=max(len(ids), 16), filter=flt, with_payload=True)
            records, offset = self._call(self._require().scroll, req)
            for r in records:
                ev = ic.evidence_from_payload(r.payload or {})
                found[ev.id] = ev
            if offset is None:
                return [found[i] for i in ids if i in found]

    @in_shard
    def count(self) -> int:
        """Live points."""
        return self._count_where(self._live_filter())

    @in_shard
    def missing_access(self) -> int:
        """Live points that carry no permissions (indexed before they were synced)."""
        return self._missing_access()

    def _missing_access(self) -> int:
        live = self._live_filter()
        return self._count_where(qe.Filter(must=[*(live.must or []), qe.IsEmptyCondition(ic.ACL_FIELDS[0])]))

    async def ready(self) -> None:
        await self.count()

    @in_shard
    def stats(self) -> dict[str, object]:
        live = match(ic.STATE, ic.LIVE)
        by_kind = {k: self._count_where(qe.Filter(must=[live, match("kind", k)])) for k in EVIDENCE_KINDS}
        return {
            "backend": "qdrant-edge",
            "path": str(self._path),
            "points": self._count_where(self._live_filter()),
            "pages": len(self._page_column("hash")),
            "by_kind": by_kind,
            "staged": self._count_where(qe.Filter(must=[match(ic.STATE, ic.STAGED)])),
            "segments": self._call(self._require().info).segments_count,
            "disk_bytes": sum(
                f.stat().st_blocks * 512 for f in (self._path / SHARD_DIR).rglob("*") if f.is_file()
            ),
            "without_permissions": self._missing_access(),
            "embedder": self._embedder,
            "dim": self._dim,
        }

    async def export_points(self, batch: int = 256, *,
                            page_ids: Sequence[str] | None = None) -> AsyncIterator[IndexPoint]:
        """Every live point (of ``page_ids``, default all) with its vectors; a page's points are consecutive.

        For ``evident index migrate``: the consumer can ``replace_page`` each page as it completes while
        holding
        only one page in memory. Each scroll of ``batch`` points is one short thread hop; run it on an index
        nobody writes to, or a page swapped meanwhile may be exported old or new.
        """
        pages = sorted(await self.page_hashes()) if page_ids is None else list(page_ids)
        for page_id in pages:
            offset: Any = None
            while True:
                points, offset = await self._export_batch(page_id, offset, max(1, batch))
                for point in points:
                    yield point
                if offset is None:
                    break

    @in_shard
    def _export_batch(self, page_id: str, offset: Any, batch: int) -> tuple[list[IndexPoint], Any]:
        flt = qe.Filter(must=[match("page_id", page_id), match(ic.STATE, ic.LIVE)])
        req = qe.ScrollRequest(offset=offset, limit=batch, filter=flt, with_payload=True, with_vector=True)
        records, next_offset = self._call(self._require().scroll, req)
        return [ic.point_from_record(r) for r in records], next_offset


def _rankers(request: SearchRequest) -> list[tuple[tuple[Any, ...], int]]:
    """Each ranker a request runs (kind, query vector, scope) with its depth, in ``_legs``' order: a hybrid's
    prefetch k, or a lone ranker's limit."""
    use_sparse, use_dense = ic.query_legs(request)
    hybrid = request.mode == "hybrid"
    rankers: list[tuple[tuple[Any, ...], int]] = []
    if use_sparse and request.sparse is not None:
        depth = request.lexical_k if hybrid else request.limit
        rankers.append((("sparse", request.sparse, request.scope), depth))
    if use_dense and request.dense is not None:
        depth = request.dense_k if hybrid else request.limit
        rankers.append((("dense", request.dense, request.scope), depth))
    return rankers


def _shared_legs(requests: Sequence[SearchRequest]) -> dict[tuple[Any, ...], int]:
    """The hybrid rankers that a lone request of the batch also asks for, to no more than their depth (the
    hybrid's prefetch k): ranker -> depth. Each runs once, and the lone request takes the top of its list."""
    depth: dict[tuple[Any, ...], int] = {}
    for r in requests:
        if r.mode == "hybrid" and r.limit > 0:
            for ranker, k in _rankers(r):
                depth[ranker] = max(k, depth.get(ranker, 0))
    shared: dict[tuple[Any, ...], int] = {}
    for r in requests:
        if r.mode != "hybrid" and r.limit > 0:
            for ranker, limit in _rankers(r):
                if depth.get(ranker, 0) >= limit:
                    shared[ranker] = depth[ranker]
    return shared


def _hits(scored: Sequence[Any]) -> list[Hit]:
    return [Hit(ic.evidence_from_payload(p.payload or {}), float(p.score), rank,
                str((p.payload or {}).get("content", ""))) for rank, p in enumerate(scored, start=1)]
