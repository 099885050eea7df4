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
from collections.abc import Awaitable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from qdrant_client import AsyncQdrantClient, models

from pipeline.access.scope import EVERYONE, AccessScope
from pipeline.errors import (
    ConfigError,
    IndexError_,
)
from pipeline.index import common as ic

T = TypeVar("T")

METADATA_KEY = "evident"


def match(key: str, value: str) -> models.FieldCondition:
    return models.FieldCondition(key=key, match=models.MatchValue(value=value))


def match_any(key: str, values: Sequence[str]) -> models.FieldCondition:
    return models.FieldCondition(key=key, match=models.MatchAny(any=list(values)))


class QdrantCollection:
    """One Qdrant collection (server URL, or qdrant-client local ``location``/``path``) and the helpers every
    operation on it uses."""

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

    def _live_filter(self, scope: AccessScope | None = None) -> models.Filter:
        """Live points, within ``scope`` (its spaces and readers) when one is given."""
        must: list[Any] = [match(ic.STATE, ic.LIVE)]
        must.extend(match_any(key, values) for key, values in (scope.conditions() if scope else ()))
        must.extend(models.Filter(should=[models.IsEmptyCondition(is_empty=models.PayloadField(key=f)),
                                          match_any(f, [EVERYONE])])
                    for f in (scope.open_fields() if scope else ()))
        return models.Filter(must=must)

    async def _delete(self, flt: models.Filter) -> None:
        client = self._require()
        await self._do(
            client.delete(self._collection, points_selector=models.FilterSelector(filter=flt), wait=True)
        )

