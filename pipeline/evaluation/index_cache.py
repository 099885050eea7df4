"""A cached index per (document set, indexing configuration), so repeated evals never re-embed."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterable, Callable
from pathlib import Path

from pipeline.ingest.run import IngestReport, ingest_pages
from pipeline.protocols import Embedder, Index, SparseEncoder
from pipeline.runtime.settings import Settings
from pipeline.types import Page

PageSource = Callable[[], AsyncIterable[Page]]


async def open_eval_index(
    settings: Settings, documents_key: str, pages: PageSource, *, progress: bool = True
) -> tuple[Index, Embedder, SparseEncoder, IngestReport]:
    """Open (building or updating as needed) the embedded eval index for this configuration."""
    from pipeline.factory import ingest_options, make_embedder_from, make_index_from, make_sparse_from

    options = ingest_options(settings)
    embedder = make_embedder_from(settings)
    sparse = make_sparse_from(settings, embedder)
    fp = options.fingerprint(embedder.name, sparse.name)
    key = hashlib.sha1(documents_key.encode()).hexdigest()[:10]
    index_dir = Path(settings.data_dir) / "eval-index" / f"{key}-{fp}"
    index = make_index_from(settings.replace(qdrant_url=None), index_dir)
    await index.open(dense_dim=embedder.dim, embedder=embedder.name)
    report = await ingest_pages(pages(), index=index, embedder=embedder, sparse=sparse, options=options,
                                progress=progress)
    return index, embedder, sparse, report
