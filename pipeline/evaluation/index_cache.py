"""A cached index per (document set, indexing configuration), so repeated evals never re-embed."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterable, Callable
from pathlib import Path

from pipeline.ingest.report import IngestReport
from pipeline.ingest.run import ingest_pages
from pipeline.models.vocabulary import KeywordExpander
from pipeline.protocols import Embedder, Index, SparseEncoder
from pipeline.settings import PipelineSettings
from pipeline.types import Page

PageSource = Callable[[], AsyncIterable[Page]]


async def open_eval_index(
    settings: PipelineSettings, documents_key: str, pages: PageSource, *, progress: bool = True
) -> tuple[Index, Embedder, SparseEncoder, IngestReport]:
    """Open (building or updating as needed) the embedded eval index for this configuration."""
    from pipeline.factory import (
        ingest_options,
        make_embedder_from,
        make_index_from,
        make_sparse_from,
        vocabulary_path,
    )

    options = ingest_options(settings)
    embedder = make_embedder_from(settings)
    sparse = make_sparse_from(settings, embedder)
    index_dir = eval_index_dir(settings, documents_key, embedder, sparse)
    index = make_index_from(settings.replace(qdrant_url=None), index_dir)
    await index.open(dense_dim=embedder.dim, embedder=embedder.name)
    report = await ingest_pages(pages(), index=index, embedder=embedder, sparse=sparse, options=options,
                                progress=progress, vocabulary=vocabulary_path(settings, index_dir))
    return index, embedder, sparse, report


def eval_index_dir(
    settings: PipelineSettings, documents_key: str, embedder: Embedder, sparse: SparseEncoder
) -> Path:
    """Where the eval index of these documents under this indexing configuration lives."""
    from pipeline.factory import ingest_options

    fp = ingest_options(settings).fingerprint(embedder.name, sparse.name)
    key = hashlib.sha1(documents_key.encode()).hexdigest()[:10]
    return Path(settings.core.data_dir) / "eval-index" / f"{key}-{fp}"


def eval_expander(settings: PipelineSettings, documents_key: str, embedder: Embedder,
                  sparse: SparseEncoder) -> KeywordExpander | None:
    """The keyword expander over the eval index's vocabulary (None when expansion is off)."""
    from pipeline.factory import make_expander_from

    return make_expander_from(
        settings, embedder, sparse, eval_index_dir(settings, documents_key, embedder, sparse)
    )
