"""``Index`` on a Qdrant server/cluster through ``AsyncQdrantClient`` (also its local mode, for tests).

Same collection layout, ids and payload as the Edge backend (``pipeline.index.common``); the
embedder name and dimension are stored in the collection's metadata.

Atomic page swaps on a server. Qdrant has no multi-operation transactions, so ``replace_page``
orders its steps so that a reader sees *old-only, then (briefly) nothing, then new-only* for the
page — never a mix of versions:

1. delete staged leftovers of the page; 2. upsert the new version ``state=staged`` (invisible);
3. delete the old live points; 4. flip the new ids to ``state=live``.

Each step waits for the server (``wait=True``). A failure during step 2 leaves the old version live
and complete; the staged leftovers are removed by the next ``replace_page`` of the page and by
``open``. A failure between steps 3 and 4 leaves the page absent, so ``page_hashes`` no longer
lists it and the next sync re-ingests it. During step 4 a reader may briefly see part of the new
version (still never old and new together). IDF statistics are collection-wide (servers before
the ``idf`` search parameter reject a corpus filter), so staged points count toward IDF for the
duration of a swap only.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from qdrant_client import AsyncQdrantClient, models
from qdrant_client.http.exceptions import ResponseHandlingException, UnexpectedResponse

from pipeline.errors import (
    AuthError,
    ConfigError,
    EvidentError,
    IndexError_,
    TransientError,
    UnreachableError,
)
from pipeline.index import common as ic
from pipeline.types import EVIDENCE_KINDS, Evidence, Hit, IndexPoint, SearchRequest

T = TypeVar("T")

METADATA_KEY = "evident"


def _match(key: str, value: str) -> models.FieldCondition:
    return models.FieldCondition(key=key, match=models.MatchValue(value=value))


def _match_any(key: str, values: Sequence[str]) -> models.FieldCondition:
    return models.FieldCondition(key=key, match=models.MatchAny(any=list(values)))


class QdrantServerIndex:
    """Hybrid index in one Qdrant collection (server URL, or qdrant-client local ``location``/``path``)."""

    batch_size: int = ic.WRITE_BATCH
    # Fuse (weighted) RRF inside Qdrant with ``RrfQuery``; set False to fuse client-side. It is turned
    # off automatically when the server rejects ``RrfQuery`` (servers before weighted RRF).
    engine_fusion: bool = True

    def __init__(
        self,
        *,
        url: str | None = None,
        api_key: str | None = None,
        location: str | None = None,
        path: Path | None = None,
        collection: str = "evident",
        shard_number: int = 1,
        replication_factor: int = 1,
        write_consistency_factor: int = 1,
    ) -> None:
        if sum(x is not None for x in (url, location, path)) != 1:
            raise ConfigError("QdrantServerIndex needs exactly one of url (QDRANT_URL), location or path")
        self._url, self._api_key, self._location, self._path = url, api_key, location, path
        self._collection = collection
        self._shard_number = shard_number
        self._replication_factor = replication_factor
        self._write_consistency_factor = write_consistency_factor
        self._client: AsyncQdrantClient | None = None
        self._dim = 0
        self._embedder = ""
        self._write_lock = asyncio.Lock()

    @property
    def where(self) -> str:
        place = self._url or (str(self._path) if self._path is not None else self._location)
        return f"collection '{self._collection}' at {place}"

    # ------------------------------------------------------------------ plumbing

    def _new_client(self) -> AsyncQdrantClient:
        # check_compatibility=False: the version probe is a blocking HTTP call in the constructor.
        return AsyncQdrantClient(
            url=self._url,
            api_key=self._api_key or None,
            location=self._location,
            path=str(self._path) if self._path is not None else None,
            check_compatibility=False,
        )

    def _require(self) -> AsyncQdrantClient:
        if self._client is None:
            raise IndexError_(f"{self.where} is not open; call open() first")
        return self._client

    async def _do(self, call: Awaitable[T]) -> T:
        """Await one client call, turning its errors into ``IndexError_``."""
        try:
            return await call
        except Exception as exc:
            raise IndexError_(f"qdrant {self.where}: {exc}") from exc

    def _live_filter(self, spaces: Sequence[str] | None = None) -> models.Filter:
        must: list[Any] = [_match(ic.STATE, ic.LIVE)]
        if spaces is not None:
            must.append(_match_any("space", spaces))
        return models.Filter(must=must)

    async def _delete(self, flt: models.Filter) -> None:
        client = self._require()
        await self._do(
            client.delete(self._collection, points_selector=models.FilterSelector(filter=flt), wait=True)
        )

    # ------------------------------------------------------------------ open / close

    async def open(self, *, dense_dim: int, embedder: str, recipe: Mapping[str, Any] | None = None) -> None:
        """Create the collection if needed; raise ``IndexMismatchError`` on another embedder/dimension."""
        if self._client is not None:
            raise IndexError_(f"{self.where} is already open")
        client = self._new_client()
        self._client = client
        try:
            await self._open(client, dense_dim, embedder, recipe)
        except IndexError_ as exc:
            self._client = None
            await client.close()
            raise self._open_error(exc) from exc.__cause__
        except BaseException:
            self._client = None
            await client.close()
            raise
        self._dim, self._embedder = dense_dim, embedder

    def _open_error(self, exc: IndexError_) -> EvidentError:
        """At open, say which setting is wrong: a rejected key and an unreachable server are the usual
        first-day errors, and the second is worth retrying (``evident serve`` does)."""
        cause = exc.__cause__
        if isinstance(cause, UnexpectedResponse) and cause.status_code in (401, 403):
            return AuthError(f"Qdrant at {self.where} rejected QDRANT_API_KEY (HTTP {cause.status_code})",
                             service="qdrant", status=cause.status_code)
        if isinstance(cause, UnexpectedResponse) and (cause.status_code or 0) >= 500:
            return TransientError(
                f"Qdrant at {self.where} answered HTTP {cause.status_code}",
                service="qdrant",
                status=cause.status_code,
            )
        if isinstance(cause, ResponseHandlingException):
            return UnreachableError(f"cannot reach Qdrant at {self.where} (QDRANT_URL): "
                                    f"{type(cause.source).__name__}", service="qdrant")
        return exc

    async def _open(self, client: AsyncQdrantClient, dense_dim: int, embedder: str,
                    recipe: Mapping[str, Any] | None = None) -> None:
        if await self._do(client.collection_exists(self._collection)):
            info = await self._do(client.get_collection(self._collection))
            stored = dict((info.config.metadata or {}).get(METADATA_KEY) or {})
            vectors = info.config.params.vectors
            dense = vectors.get(ic.DENSE) if isinstance(vectors, dict) else None
            actual_dim = dense.size if dense is not None else None
            if not stored:  # created by hand or by an older evident: judge by the vector size only
                stored = {"embedder": embedder, "dim": actual_dim}
            elif actual_dim is not None and actual_dim != stored.get("dim"):
                stored["dim"] = actual_dim
            ic.check_manifest(stored, embedder=embedder, dense_dim=dense_dim, where=self.where, recipe=recipe)
        else:
            await self._do(
                client.create_collection(
                    self._collection,
                    vectors_config={
                        ic.DENSE: models.VectorParams(size=dense_dim, distance=models.Distance.COSINE)
                    },
                    sparse_vectors_config={
                        ic.SPARSE: models.SparseVectorParams(
                            modifier=models.Modifier.IDF
                            if (recipe or {}).get("sparse_idf", True)
                            else models.Modifier.NONE
                        )
                    },
                    shard_number=self._shard_number,
                    replication_factor=self._replication_factor,
                    write_consistency_factor=self._write_consistency_factor,
                    metadata={METADATA_KEY: ic.manifest(embedder, dense_dim, recipe)},
                )
            )
            if self._url is not None:  # local mode has no payload indexes (and warns about them)
                for name in ic.KEYWORD_FIELDS:
                    await self._do(
                        client.create_payload_index(
                            self._collection, name, field_schema=models.PayloadSchemaType.KEYWORD, wait=True
                        )
                    )
        await self._delete(models.Filter(must=[_match(ic.STATE, ic.STAGED)]))

    async def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.close()

    async def optimize(self) -> bool:
        """The server's optimizers run in the background after writes: nothing to do here."""
        return False

    async def drop(self) -> None:
        """Delete the collection (``--rebuild``). The index must be opened again afterwards."""
        client = self._client or self._new_client()
        try:
            await self._do(client.delete_collection(self._collection))
        finally:
            self._client = None
            await client.close()

    # ------------------------------------------------------------------ writes

    async def replace_page(self, page_id: str, page_hash: str, points: Sequence[IndexPoint]) -> None:
        """Swap in a page version: readers see old-only, briefly nothing, then new-only (module doc)."""
        async with self._write_lock:
            client = self._require()
            page = _match("page_id", page_id)
            await self._delete(models.Filter(must=[page, _match(ic.STATE, ic.STAGED)]))
            live_hash = await self._live_hash(page_id)
            # Same version again: ids collide with the live points, so rewrite in place (identical
            # content by hash) and drop evidence no longer produced.
            in_place = live_hash == page_hash
            state = ic.LIVE if in_place else ic.STAGED
            new_ids: list[str] = []
            batch: list[IndexPoint] = []
            for point in points:
                ic.check_point(page_id, page_hash, point, self._dim)
                batch.append(point)
                if len(batch) >= self.batch_size:
                    new_ids += await self._upsert(batch, state)
                    batch = []
            if batch:
                new_ids += await self._upsert(batch, state)
            live_old: list[Any] = [page, _match(ic.STATE, ic.LIVE)]
            if in_place:
                keep: list[Any] = [models.HasIdCondition(has_id=list(new_ids))] if new_ids else []
                await self._delete(models.Filter(must=live_old, must_not=keep or None))
                return
            await self._delete(models.Filter(must=live_old))
            if new_ids:
                await self._do(
                    client.set_payload(
                        self._collection, payload={ic.STATE: ic.LIVE}, points=list(new_ids), wait=True
                    )
                )

    async def _live_hash(self, page_id: str) -> str | None:
        client = self._require()
        flt = models.Filter(must=[_match("page_id", page_id), _match(ic.STATE, ic.LIVE)])
        records, _ = await self._do(
            client.scroll(
                self._collection, scroll_filter=flt, limit=1, with_payload=["page_hash"], with_vectors=False
            )
        )
        return str(records[0].payload["page_hash"]) if records and records[0].payload else None

    async def _upsert(self, batch: Sequence[IndexPoint], state: str) -> list[str]:
        client = self._require()
        ids = [ic.point_id(p.evidence.id, p.page_hash) for p in batch]
        structs = [
            models.PointStruct(
                id=pid,
                vector={
                    ic.DENSE: [float(x) for x in p.dense],
                    ic.SPARSE: models.SparseVector(
                        indices=list(p.sparse.indices), values=[float(v) for v in p.sparse.values]
                    ),
                },
                payload=ic.to_payload(p, state),
            )
            for pid, p in zip(ids, batch, strict=True)
        ]
        await self._do(client.upsert(self._collection, points=structs, wait=True))
        return ids

    async def delete_pages(self, page_ids: Sequence[str]) -> None:
        """Remove pages (live and staged points)."""
        if not page_ids:
            return
        async with self._write_lock:
            await self._delete(models.Filter(must=[_match_any("page_id", list(page_ids))]))

    # ------------------------------------------------------------------ reads

    async def search(self, request: SearchRequest) -> list[Hit]:
        """Lexical, dense, or hybrid: (weighted) RRF inside Qdrant, or client-side when unsupported."""
        client = self._require()
        use_sparse, use_dense = ic.query_legs(request)
        if not (use_sparse or use_dense) or request.limit <= 0:
            return []
        flt = self._live_filter(request.spaces)
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
        by_id = {h.evidence.id: h for hits in lists for h in hits}
        fused = (
            ic.dbsf_fuse([[(h.evidence.id, h.score) for h in hits] for hits in lists])
            if request.fusion == "dbsf"
            else ic.rrf_fuse(
                [[h.evidence.id for h in hits] for hits in lists], k=request.rrf_k, weights=weights
            )
        )
        return [
            Hit(by_id[eid].evidence, score, rank, by_id[eid].content)
            for rank, (eid, score) in enumerate(fused[: request.limit], start=1)
        ]

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

    async def get(self, evidence_ids: Sequence[str]) -> list[Evidence]:
        """Live evidence by id, in the given order; unknown ids are skipped."""
        if not evidence_ids:
            return []
        client = self._require()
        ids = list(evidence_ids)
        flt = models.Filter(must=[_match(ic.STATE, ic.LIVE), _match_any("evidence_id", ids)])
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

    async def ready(self) -> None:
        await self.count()

    async def export_points(self, batch: int = 256, *,
                            page_ids: Sequence[str] | None = None) -> AsyncIterator[IndexPoint]:
        """Every live point (of ``page_ids``, default all) with its vectors, a page at a time."""
        client = self._require()
        for page_id in sorted(await self.page_hashes()) if page_ids is None else list(page_ids):
            flt = models.Filter(must=[_match("page_id", page_id), _match(ic.STATE, ic.LIVE)])
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
        live = _match(ic.STATE, ic.LIVE)
        by_kind = {
            k: await self._count(models.Filter(must=[live, _match("kind", k)])) for k in EVIDENCE_KINDS
        }
        return {
            "backend": "qdrant",
            "collection": self._collection,
            "location": self.where,
            "points": await self.count(),
            "pages": len(await self.page_hashes()),
            "by_kind": by_kind,
            "staged": await self._count(models.Filter(must=[_match(ic.STATE, ic.STAGED)])),
            "embedder": self._embedder,
            "dim": self._dim,
        }
