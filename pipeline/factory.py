"""Builds every client from the settings, in one place, so nothing else reads configuration.

Heavy imports (model runtimes, qdrant-client) happen here lazily, so a CLI command only pays for
what it uses.
"""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.answer.retrieve import RetrievalConfig
from pipeline.errors import ConfigError, EvidentError, InputError
from pipeline.ingest.run import IngestOptions
from pipeline.protocols import LLM, Embedder, Index, Reranker, SparseEncoder
from pipeline.runtime.settings import CONTEXT_ITEMS, Settings

if TYPE_CHECKING:
    from pipeline.models.vocabulary import KeywordExpander
    from pipeline.store import Store


def ingest_options(settings: Settings) -> IngestOptions:
    dense_items = settings.dense_context_items
    if dense_items is not None and tuple(dense_items) in (("none",), ()):
        dense_items = ()
    elif dense_items is not None and tuple(dense_items) == ("same",):
        dense_items = None
    unknown = [c for c in (*settings.context_items, *(dense_items or ())) if c not in CONTEXT_ITEMS]
    if unknown:
        raise ConfigError(
            f"EVIDENT_CONTEXT_ITEMS: unknown item(s) {', '.join(unknown)}; choose from {', '.join(CONTEXT_ITEMS)}"
        )
    if settings.table_indexing not in ("rows", "tables", "both"):
        raise ConfigError("EVIDENT_TABLE_INDEXING must be rows, tables or both")
    from pipeline.ingest.storage import ParseLimits

    return IngestOptions(
        max_page_bytes=settings.max_page_bytes,
        max_evidence_chars=settings.max_evidence_chars,
        max_evidence_per_page=settings.max_evidence_per_page,
        parse=ParseLimits(timeout_s=settings.page_timeout_s, max_table_cells=settings.max_table_cells,
                          min_coverage=settings.min_text_coverage),
        context_items=tuple(settings.context_items),
        context_item_max_chars=settings.context_item_max_chars,
        table_indexing=settings.table_indexing,
        linearization=settings.linearization,
        dense_context_items=None if dense_items is None else tuple(dense_items),
    )


def retrieval_config(settings: Settings) -> RetrievalConfig:
    if settings.retrieval_mode not in ("lexical", "dense", "hybrid"):
        raise ConfigError("EVIDENT_RETRIEVAL_MODE must be lexical, dense or hybrid")
    return RetrievalConfig(
        mode=settings.retrieval_mode,  # type: ignore[arg-type]
        lexical_k=settings.lexical_k,
        dense_k=settings.dense_k,
        final_k=settings.final_k,
        rrf_k=settings.rrf_k,
        fusion=settings.fusion,  # type: ignore[arg-type]
        adaptive_min_k=settings.adaptive_min_k,
        hub_weight=settings.hub_weight,
        continuity_boost=settings.continuity_boost,
        page_aggregation=settings.page_aggregation,
        prf_docs=settings.prf_docs,
        keyword_weight=settings.keyword_weight,
        keyword_min_similarity=settings.keyword_min_similarity,
    )


def vocabulary_path(settings: Settings, index_dir: Path | None = None) -> Path | None:
    """Where the keyword-expansion vocabulary of the configured index lives (``<data dir>/vocabulary/``), or
    None when expansion is off or the sparse encoder is not BM25."""
    if settings.keyword_weight <= 0 or settings.sparse_encoder.strip() != "bm25":
        return None
    return _vocabulary_file(settings, index_dir)


def _vocabulary_file(settings: Settings, index_dir: Path | None = None) -> Path:
    if settings.qdrant_url:
        name = f"qdrant-{settings.collection}"
    else:
        where = str(Path(index_dir or settings.resolved_index_dir).resolve())
        name = f"edge-{hashlib.sha1(where.encode()).hexdigest()[:12]}"
    return Path(settings.data_dir) / "vocabulary" / f"{name}.npz"


def make_expander_from(settings: Settings, embedder: Embedder, sparse: SparseEncoder,
                       index_dir: Path | None = None) -> KeywordExpander | None:
    """The keyword expander over the index's vocabulary (None when expansion is off)."""
    from pipeline.models.sparse import Bm25Encoder
    from pipeline.models.vocabulary import KeywordExpander

    path = vocabulary_path(settings, index_dir)
    if path is None or not isinstance(sparse, Bm25Encoder):
        return None
    return KeywordExpander(path, embedder, sparse)


def make_embedder_from(settings: Settings, *, cache: bool = True) -> Embedder:
    from pipeline.models.embedders import make_embedder
    from pipeline.models.openai_embedder import RemoteEmbedding

    remote = RemoteEmbedding(
        base_url=settings.embed_base_url or "", api_key=settings.embed_api_key.reveal(),
        concurrency=settings.embed_concurrency, max_request_tokens=settings.embed_max_request_tokens,
        dimensions=settings.embed_dimensions or None, query_prefix=settings.embed_query_prefix,
        document_prefix=settings.embed_document_prefix, api_version=settings.embed_api_version,
    )
    embedder = make_embedder(
        settings.embedder, batch_size=settings.embed_batch_size, max_tokens=settings.embed_max_tokens,
        runtime=settings.embed_runtime, device=settings.embed_device, precision=settings.embed_precision,
        threads=settings.embed_threads, remote=remote, process=settings.embed_process,
    )
    if cache:
        from pipeline.models.embed_cache import CachedEmbedder

        embedder = CachedEmbedder(embedder, Path(settings.data_dir) / "cache")
    return embedder


def make_sparse_from(settings: Settings, embedder: Embedder | None = None) -> SparseEncoder:
    from pipeline.models.sparse import make_sparse_encoder

    # The cache wraps the model; bge-m3's sparse half must come from the model itself.
    return make_sparse_encoder(settings.sparse_encoder, embedder=getattr(embedder, "inner", embedder))


async def open_stack(settings: Settings, index_dir: Path | None = None, *, require_index: bool = False,
                     serving: bool = False) -> tuple[Embedder, SparseEncoder, Index]:
    """Embedder, sparse encoder and an opened index: what every command that reads or writes the index needs.

    Opening checks the index was built with this embedder and dimension (``IndexMismatchError`` if not).
    ``require_index`` (commands that only read): a missing or empty index is an ``InputError`` that says
    so, instead of answers that "cannot be found".
    """
    embedder = await _load_embedder(settings)
    try:
        sparse = make_sparse_from(settings, embedder)
        index = await _open_index(settings, index_dir, embedder, sparse, require_index=require_index, serving=serving)
    except BaseException:
        embedder.close()  # a worker process started for the model does not outlive a failed (or cancelled) open
        raise
    return embedder, sparse, index


async def _load_embedder(settings: Settings) -> Embedder:
    """Load the model off the event loop (seconds: weights, a worker process, a remote probe), so a server's
    SIGTERM meanwhile is handled; one finished after its caller gave up (cancelled) is closed again."""
    loading = asyncio.ensure_future(asyncio.to_thread(make_embedder_from, settings))
    try:
        return await asyncio.shield(loading)
    except asyncio.CancelledError:
        loading.add_done_callback(_close_unused)
        raise


def _close_unused(loading: asyncio.Future[Embedder]) -> None:
    if not loading.cancelled() and loading.exception() is None:
        loading.result().close()


async def _open_index(settings: Settings, index_dir: Path | None, embedder: Embedder, sparse: SparseEncoder, *,
                      require_index: bool, serving: bool = False) -> Index:
    where = index_dir or settings.resolved_index_dir
    if require_index and not settings.qdrant_url and not (Path(where) / "manifest.json").is_file():
        raise InputError(f"no index at {where}: ingest pages first (evident ingest PATH, evident ingest --sample "
                         "or evident sync), or point EVIDENT_DATA_DIR / --index-dir at the right one")
    index = make_index_from(settings, index_dir, serving=serving)
    try:
        await index.open(dense_dim=embedder.dim, embedder=embedder.name, recipe=embedder_recipe(embedder, sparse))
    except BaseException:
        await index.close()  # a client built for a server that refused us is closed, not left to the GC
        raise
    if require_index and await index.count() == 0:
        await index.close()
        what = f"collection {settings.collection!r} at {settings.qdrant_url}" if settings.qdrant_url else f"index at {where}"
        raise InputError(f"the {what} is empty: ingest pages first (evident ingest PATH or evident sync)")
    return index


async def drop_index(settings: Settings, index_dir: Path | None = None) -> None:
    """Delete the configured index (``--rebuild``), whatever embedder built it; it is created again on open.
    Its keyword-expansion vocabulary goes with it."""
    await make_index_from(settings, index_dir).drop()
    from pipeline.models.vocabulary import TermCounts

    path = _vocabulary_file(settings, index_dir)  # whether expansion is on now or not
    for leftover in (path, TermCounts.path_for(path)):
        await asyncio.to_thread(leftover.unlink, missing_ok=True)


def embedder_recipe(embedder: Embedder, sparse: SparseEncoder) -> dict[str, Any]:
    """How texts become vectors beyond the dense model's name: recorded with the index, checked on every open
    (vectors cut at another length, or sparse vectors of another encoder, must not be mixed)."""
    return {"max_tokens": int(getattr(embedder, "max_tokens", 0) or 0), "sparse": sparse.name,
            "sparse_idf": bool(sparse.idf)}


def index_identity(settings: Settings) -> tuple[int, str]:
    """(dimension, embedder name) to open the index with, for commands that never embed: the embedded
    index's manifest when there is one (no model load, and no mismatch for an index built with another
    embedder), else the configured embedder."""
    if not settings.qdrant_url:
        from pipeline.index.edge_manifest import read_manifest

        try:
            name, dim = read_manifest(settings.resolved_index_dir)
            return dim, name
        except EvidentError:
            pass
    embedder = make_embedder_from(settings, cache=False)
    return embedder.dim, embedder.name


def make_index_from(settings: Settings, index_dir: Path | None = None, *, serving: bool = False) -> Index:
    """The configured index, unopened: a Qdrant server's collection, or the embedded one (in a worker
    process when ``EVIDENT_INDEX_PROCESS`` says so; ``auto``: for ``serving`` processes)."""
    if settings.qdrant_url:
        from pipeline.index.qdrant import QdrantServerIndex

        return QdrantServerIndex(
            url=settings.qdrant_url,
            api_key=settings.qdrant_api_key.reveal() or None,
            collection=settings.collection,
            shard_number=settings.shard_number,
            replication_factor=settings.replication_factor,
            write_consistency_factor=settings.write_consistency_factor,
        )
    path = Path(index_dir or settings.resolved_index_dir)
    if settings.index_process == "yes" or (settings.index_process == "auto" and serving):
        from pipeline.index.edge_worker import ProcessEdgeIndex

        return ProcessEdgeIndex(path, wait_s=settings.index_wait_s)
    from pipeline.index.edge import EdgeIndex

    return EdgeIndex(path, wait_s=settings.index_wait_s)


def make_store(settings: Settings) -> Store:
    """The SQLite conversation store (turns, feedback, checkpoints)."""
    from pipeline.store import Store

    return Store(settings.resolved_store_path)


def make_qdrant_client(settings: Settings) -> Any:
    """A synchronous ``qdrant_client.QdrantClient`` for the configured server (server-side snapshots)."""
    from qdrant_client import QdrantClient

    if not settings.qdrant_url:
        raise ConfigError("QDRANT_URL is not set")
    return QdrantClient(url=settings.qdrant_url, api_key=settings.qdrant_api_key.reveal() or None,
                        check_compatibility=False)


def make_destination_index(settings: Settings, target: str, collection: str) -> Index:
    """``evident index migrate --to``: ``http(s)://host:port`` (a server), ``path:/dir`` (qdrant-client local
    mode) or ``:memory:``; the cluster settings apply to a server."""
    from pipeline.index.qdrant import QdrantServerIndex

    target = target.strip()
    if target.startswith(("http://", "https://")):
        return QdrantServerIndex(url=target, api_key=settings.qdrant_api_key.reveal() or None, collection=collection,
                                 shard_number=settings.shard_number, replication_factor=settings.replication_factor,
                                 write_consistency_factor=settings.write_consistency_factor)
    if target.startswith("path:") and target[5:].strip():
        return QdrantServerIndex(path=Path(target[5:].strip()).expanduser(), collection=collection)
    if target == ":memory:":
        return QdrantServerIndex(location=":memory:", collection=collection)
    raise InputError(f"--to {target!r}: use a Qdrant URL (http://host:6333), path:/some/dir or :memory:")


def make_reranker_from(settings: Settings, embedder: Embedder | None = None) -> Reranker | None:
    """The configured reranker (``sentences:dense`` scores with ``embedder``)."""
    from pipeline.models.rerank import make_reranker

    return make_reranker(settings.reranker, embedder=embedder)


def make_llm_from(settings: Settings) -> LLM | None:
    """None when no endpoint is configured: the engine then answers extractively, offline."""
    if not settings.llm_base_url:
        return None
    from pipeline.models.llm import OpenAILLM

    return OpenAILLM(
        base_url=settings.llm_base_url,
        api_key=settings.llm_api_key.reveal() or "not-needed",
        model_for=settings.model_for,
        timeout_s=settings.llm_timeout_s,
        max_retries=settings.llm_max_retries,
        concurrency=settings.llm_concurrency,
    )


async def build_engine(settings: Settings, *, index_dir: Path | None = None, trace: bool = False, metrics=None,  # type: ignore[no-untyped-def]
                       require_index: bool = False, serving: bool = False):
    """Compose the conversation engine from settings (the CLI's and the bot's single entry point).

    ``serving``: a long-running bot process (``evident serve``), which gets the index in a worker process
    by default (``EVIDENT_INDEX_PROCESS``)."""
    from pipeline.answer.engine import Engine
    from pipeline.answer.prompts import PromptLibrary

    options = engine_options(settings, trace=trace)  # settings errors first, before anything is opened
    embedder, sparse, index = await open_stack(settings, index_dir, require_index=require_index, serving=serving)
    try:
        return Engine(
            index=index,
            embedder=embedder,
            sparse=sparse,
            store=make_store(settings),
            prompts=PromptLibrary(settings.resolved_prompts_dir),
            retrieval=retrieval_config(settings),
            llm=make_llm_from(settings),
            reranker=make_reranker_from(settings, embedder),
            metrics=metrics,
            options=options,
            expander=make_expander_from(settings, embedder, sparse, index_dir),
        )
    except BaseException:
        await index.close()
        await asyncio.to_thread(embedder.close)
        raise


def engine_options(settings: Settings, *, trace: bool = False):  # type: ignore[no-untyped-def]
    """Engine options from settings, shared by the bot/CLI engine and the evaluation engine."""
    from pipeline.answer.engine import EngineOptions
    from pipeline.attribution import METHODS, params_from_settings

    # Fail at start-up, not at the first 🔍 reaction, when the default explain method cannot run.
    if settings.attribution_method not in METHODS:
        raise ConfigError(f"EVIDENT_ATTRIBUTION_METHOD: unknown method {settings.attribution_method!r}; "
                          f"choose from {', '.join(METHODS)}")
    if settings.attribution_method == "logprob" and not (settings.llm_base_url and settings.llm_prompt_logprobs):
        raise ConfigError("EVIDENT_ATTRIBUTION_METHOD=logprob needs EVIDENT_LLM_BASE_URL and "
                          "EVIDENT_LLM_PROMPT_LOGPROBS=true (a vLLM or llama.cpp server)")
    if settings.llm_prompt_logprobs:
        from pipeline.answer.prompts import PromptLibrary

        PromptLibrary(settings.resolved_prompts_dir).check(settings.llm_raw_template)
    opts = ingest_options(settings)
    return EngineOptions(
        query_strategy=settings.query_strategy,
        context_tokens=settings.llm_context_tokens,
        answer_max_tokens=settings.answer_max_tokens,
        answer_style=settings.answer_style,
        attribution_method=settings.attribution_method,
        attribution_params=params_from_settings(settings),
        trace=trace,
        dense_context_items=opts.dense_context_items if opts.dense_context_items is not None else opts.context_items,
        context_item_max_chars=opts.context_item_max_chars,
        prompt_logprobs=settings.llm_prompt_logprobs,
        raw_template=settings.llm_raw_template,
        confident_k=settings.confident_k,
    )
