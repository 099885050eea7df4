"""A Confluence sync's local end for tests: a real embedded index and store in a temporary directory, the hash
embedder, and ``run`` for one sync cycle of a source against them."""

from __future__ import annotations

from pathlib import Path
from typing import Self

from helpers import HashEmbedder, ingest_options

from connectors.confluence.source import ConfluenceSource
from connectors.confluence.sync import SyncReport, sync_confluence
from pipeline.index.edge import EdgeIndex
from pipeline.models.sparse import Bm25Encoder
from pipeline.store import Store


class SyncSite:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp

    async def __aenter__(self) -> Self:
        self.embedder = HashEmbedder()
        self.index = EdgeIndex(self.tmp / "index")
        await self.index.open(dense_dim=self.embedder.dim, embedder=self.embedder.name)
        self.store = await Store.open(self.tmp / "s.db")
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.index.close()
        await self.store.close()

    async def run(self, src: ConfluenceSource) -> SyncReport:
        return await sync_confluence(source=src, index=self.index, embedder=self.embedder,
                                     sparse=Bm25Encoder(), store=self.store, options=ingest_options())

    async def ids(self) -> set[str]:
        return set(await self.index.page_hashes())
