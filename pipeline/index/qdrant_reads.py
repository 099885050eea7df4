"""The reading half of the Qdrant server backend: searches, page tables, evidence by id, counts, exports."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any

from qdrant_client import AsyncQdrantClient, models
from qdrant_client.http.exceptions import UnexpectedResponse

from pipeline.access.scope import AccessScope
from pipeline.errors import IndexError_
from pipeline.index import common as ic
from pipeline.index.qdrant_collection import QdrantCollection, match, match_any
from pipeline.types import EVIDENCE_KINDS, Evidence, Hit, IndexPoint, SearchRequest


class QdrantReads(QdrantCollection):
    async def search(self, request: SearchRequest) -> list[Hit]:
        """Lexical, dense, or hybrid: (weighted) RRF inside Qdrant, or client-side when unsupported."""
        client = self._require()
        use_sparse, use_dense = ic.query_legs(request)
        if not (use_sparse or use_dense) or request.limit <= 0:
            return []
        flt = self._live_filter(request.scope)
        legs: list[tuple[Any, str, int]] = []
        if use_sparse and request.sparse is not None:
            vec = models.SparseVector(
                indices=list(request.sparse.indices), values=[float(v) for v in request.sparse.values]
            )
            legs.append((vec, ic.SPARSE, request.lexical_k))
        if use_dense and request.dense is not None:
            legs.append(([float(x) for x in request.dense], ic.DENSE, request.dense_k))
        if request.mode != "hybrid":
            query, using, _ = legs[0]
            return await self._query(client, query=query, using=using, query_filter=flt, limit=request.limit)
        weights = ic.leg_weights(request, use_sparse, use_dense)
        if self.engine_fusion:
            prefetch = [models.Prefetch(query=q, using=u, limit=k, filter=flt) for q, u, k in legs]
            fusion: Any = (
                models.FusionQuery(fusion=models.Fusion.DBSF)
                if request.fusion == "dbsf"
                else models.RrfQuery(rrf=models.Rrf(k=ic.engine_rrf_k(request.rrf_k), weights=weights))
            )
            try:
                return await self._query(
                    client, prefetch=prefetch, query=fusion, query_filter=flt, limit=request.limit
                )
            except IndexError_ as exc:
                if not isinstance(exc.__cause__, UnexpectedResponse) or exc.__cause__.status_code not in (
                    400,
                    422,
                ):
                    raise
                self.engine_fusion = False  # an older server: fuse client-side from now on
        return await self._client_fused(client, legs, flt, request, weights)

    async def search_many(self, requests: Sequence[SearchRequest]) -> list[list[Hit]]:
        """Concurrent requests over the client's connection pool (the server runs them in parallel)."""
        return list(await asyncio.gather(*(self.search(r) for r in requests)))

    async def _query(self, client: AsyncQdrantClient, **kwargs: Any) -> list[Hit]:
        response = await self._do(client.query_points(self._collection, with_payload=True, **kwargs))
        return [
            Hit(
                ic.evidence_from_payload(p.payload or {}),
                float(p.score),
                rank,
                str((p.payload or {}).get("content", "")),
            )
            for rank, p in enumerate(ic.stable_order(list(response.points)), start=1)
        ]

    async def _client_fused(
        self,
        client: AsyncQdrantClient,
        legs: list[tuple[Any, str, int]],
        flt: models.Filter,
        request: SearchRequest,
        weights: list[float] | None,
    ) -> list[Hit]:
        """Weighted RRF or DBSF in Python on the legs' results (same formulas as the engine)."""
        lists = await asyncio.gather(
            *(self._query(client, query=q, using=u, query_filter=flt, limit=k) for q, u, k in legs)
        )
        return ic.fuse_hits(lists, request, weights)

    async def page_hashes(self) -> dict[str, str]:
        return await self._page_field("page_hash")

    async def page_spaces(self) -> dict[str, str]:
        return await self._page_field("space")

    async def _page_field(self, key: str) -> dict[str, str]:
        client = self._require()
        out: dict[str, str] = {}
        offset: Any = None
        while True:
            records, offset = await self._do(
                client.scroll(
                    self._collection,
                    scroll_filter=self._live_filter(),
                    limit=2048,
                    offset=offset,
                    with_payload=["page_id", key],
                    with_vectors=False,
                )
            )
            for r in records:
                if r.payload:
                    out[str(r.payload["page_id"])] = str(r.payload.get(key) or "")
            if offset is None:
                return out

    async def get(self, evidence_ids: Sequence[str], scope: AccessScope) -> list[Evidence]:
        """Live evidence by id visible in ``scope``, in the given order; unknown or hidden ids are skipped."""
        if not evidence_ids:
            return []
        client = self._require()
        ids = list(evidence_ids)
        flt = models.Filter(must=[*(self._live_filter(scope).must or []), match_any("evidence_id", ids)])
        found: dict[str, Evidence] = {}
        offset: Any = None
        while True:
            records, offset = await self._do(
                client.scroll(
                    self._collection, scroll_filter=flt, limit=max(len(ids), 16), offset=offset,
                    with_payload=True, with_vectors=False,
                )
            )
            for r in records:
                ev = ic.evidence_from_payload(r.payload or {})
                found[ev.id] = ev
            if offset is None:
                break
        return [found[i] for i in ids if i in found]

    async def count(self) -> int:
        """Live points."""
        return await self._count(self._live_filter())

    async def missing_access(self) -> int:
        """Live points that carry no permissions (indexed before they were synced)."""
        empty = models.IsEmptyCondition(is_empty=models.PayloadField(key=ic.ACL_FIELDS[0]))
        return await self._count(models.Filter(must=[*(self._live_filter().must or []), empty]))

    async def ready(self) -> None:
        await self.count()

    async def export_points(self, batch: int = 256, *,
                            page_ids: Sequence[str] | None = None) -> AsyncIterator[IndexPoint]:
        """Every live point (of ``page_ids``, default all) with its vectors, a page at a time."""
        client = self._require()
        for page_id in sorted(await self.page_hashes()) if page_ids is None else list(page_ids):
            flt = models.Filter(must=[match("page_id", page_id), match(ic.STATE, ic.LIVE)])
            offset: Any = None
            while True:
                records, offset = await self._do(
                    client.scroll(
                        self._collection,
                        scroll_filter=flt,
                        limit=max(1, batch),
                        offset=offset,
                        with_payload=True,
                        with_vectors=True,
                    )
                )
                for record in records:
                    yield ic.point_from_record(record)
                if offset is None:
                    break

    async def _count(self, flt: models.Filter) -> int:
        client = self._require()
        result = await self._do(client.count(self._collection, count_filter=flt, exact=True))
        return int(result.count)

    async def stats(self) -> dict[str, object]:
        live = match(ic.STATE, ic.LIVE)
        by_kind = {
            k: await self._count(models.Filter(must=[live, match("kind", k)])) for k in EVIDENCE_KINDS
        }
        return {
            "backend": "qdrant",
            "collection": self._collection,
            "location": self.where,
            "points": await self.count(),
            "pages": len(await self.page_hashes()),
            "by_kind": by_kind,
            "staged": await self._count(models.Filter(must=[match(ic.STATE, ic.STAGED)])),
            "without_permissions": await self.missing_access(),
            "embedder": self._embedder,
            "dim": self._dim,
        }
