"""``Index`` on a Qdrant server/cluster through ``AsyncQdrantClient`` (also its local mode, for tests): the
collection's lifecycle and its atomic page swaps (see ``pipeline.index.qdrant_collection``); reads are in
``pipeline.index.qdrant_reads``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from qdrant_client import AsyncQdrantClient, models
from qdrant_client.http.exceptions import ResponseHandlingException, UnexpectedResponse

from pipeline.access.scope import PageAccess, acl_payload
from pipeline.errors import (
    AuthError,
    EvidentError,
    IndexError_,
    IndexMismatchError,
    InputError,
    TransientError,
    UnreachableError,
)
from pipeline.index import common as ic
from pipeline.index.qdrant_collection import METADATA_KEY, match, match_any
from pipeline.index.qdrant_reads import QdrantReads
from pipeline.types import IndexPoint


class QdrantServerIndex(QdrantReads):
    """Hybrid index in one Qdrant collection (server URL, or qdrant-client local ``location``/``path``)."""

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
            await self._check_existing(client, dense_dim, embedder, recipe)
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
        await self._delete(models.Filter(must=[match(ic.STATE, ic.STAGED)]))

    async def recipe(self) -> dict[str, Any] | None:
        """The recipe the collection's metadata records (see ``Index.recipe``)."""
        info = await self._do(self._require().get_collection(self._collection))
        recipe = self._metadata(info).get("recipe")
        return dict(recipe) if isinstance(recipe, Mapping) else None

    async def _check_existing(self, client: AsyncQdrantClient, dense_dim: int, embedder: str,
                              recipe: Mapping[str, Any] | None) -> None:
        """``IndexMismatchError`` for vectors made otherwise; a collection without a recipe (made by hand, or
        by an evident from before recipes) records this one, so other vectors are refused from now on, as
        the embedded index's manifest does."""
        info = await self._do(client.get_collection(self._collection))
        raw = self._metadata(info)
        vectors = info.config.params.vectors
        dense = vectors.get(ic.DENSE) if isinstance(vectors, dict) else None
        actual_dim = dense.size if dense is not None else None
        # created by hand or by an older evident: judged by the vector size only
        stored = dict(raw) if raw else {"embedder": embedder, "dim": actual_dim}
        if actual_dim is not None:
            stored["dim"] = actual_dim
        ic.check_manifest(stored, embedder=embedder, dense_dim=dense_dim, where=self.where, recipe=recipe)
        if recipe and not isinstance(raw.get("recipe"), Mapping):
            sparse = (info.config.params.sparse_vectors or {}).get(ic.SPARSE)
            idf = sparse is not None and sparse.modifier == models.Modifier.IDF
            if sparse is not None and idf != bool(recipe.get("sparse_idf", True)):
                has, needs = ("with", "without") if idf else ("without", "with")
                raise IndexMismatchError(f"index at {self.where} scores its sparse vectors {has} IDF; this "
                                         f"run's sparse encoder needs them {needs}: {ic.REEMBED}")
            recorded = {**raw, **ic.manifest(embedder, dense_dim, recipe)}
            await self._do(client.update_collection(self._collection, metadata={METADATA_KEY: recorded}))

    def _metadata(self, info: Any) -> dict[str, Any]:
        """What evident records in the collection's metadata ({} when nothing)."""
        raw = (info.config.metadata or {}).get(METADATA_KEY) or {}
        if not isinstance(raw, Mapping):
            raise IndexError_(f"{self.where}: the collection's metadata '{METADATA_KEY}' is not an object")
        return dict(raw)

    async def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.close()

    async def optimize(self) -> bool:
        """The server's optimizers run in the background after writes: nothing to do here."""
        return False

    async def snapshot(self, dest: Path) -> dict[str, object]:
        """A server-side snapshot of the collection (``dest`` unused: the snapshot stays in the server's
        snapshot storage); its name, size and checksum for the backup's manifest."""
        client = self._client or self._new_client()
        try:
            described = await self._do(client.create_snapshot(collection_name=self._collection, wait=True))
        finally:
            if client is not self._client:
                await client.close()
        if described is None:
            raise IndexError_(f"Qdrant did not create a snapshot of {self.where}")
        return {"backend": "qdrant", "collection": self._collection, "name": getattr(described, "name", ""),
                "size": getattr(described, "size", None), "checksum": getattr(described, "checksum", None)}

    async def restore(self, src: Path, *, force: bool = False) -> None:
        raise InputError(f"{self.where} is restored on the Qdrant server: recover the snapshot named in the "
                         "backup's manifest (POST /collections/<name>/snapshots/recover)")

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
            page = match("page_id", page_id)
            await self._delete(models.Filter(must=[page, match(ic.STATE, ic.STAGED)]))
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
            live_old: list[Any] = [page, match(ic.STATE, ic.LIVE)]
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
        flt = models.Filter(must=[match("page_id", page_id), match(ic.STATE, ic.LIVE)])
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

    async def set_access(self, pages: Mapping[str, PageAccess | None]) -> None:
        """Write who may read each page onto its points (live and staged): payload only, nothing
        re-embedded."""
        client = self._require()
        async with self._write_lock:
            for access, ids in ic.group_by_access(pages):
                selector = models.FilterSelector(filter=models.Filter(must=[match_any("page_id", ids)]))
                if access is None:
                    call = client.delete_payload(self._collection, keys=list(ic.ACL_FIELDS), points=selector,
                                                 wait=True)
                else:
                    call = client.set_payload(self._collection, payload=acl_payload(access), points=selector,
                                              wait=True)
                await self._do(call)

    async def delete_pages(self, page_ids: Sequence[str]) -> None:
        """Remove pages (live and staged points)."""
        if not page_ids:
            return
        async with self._write_lock:
            await self._delete(models.Filter(must=[match_any("page_id", list(page_ids))]))

