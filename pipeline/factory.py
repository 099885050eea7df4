"""Builds every client of the pipeline from its settings areas, in one place.

Each package declares its own settings area (``pipeline.settings.PipelineSettings`` composes them); this
module turns them into objects. Heavy imports (model runtimes, qdrant-client) happen lazily, so a CLI command
only pays for what it uses.
"""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.errors import ConfigError, EvidentError, InputError
from pipeline.ingest.options import IngestOptions
from pipeline.protocols import LLM, Embedder, Index, Reranker, SparseEncoder
from pipeline.runtime.metrics import Metrics
from pipeline.settings import PipelineSettings

if TYPE_CHECKING:
    from pipeline.answer.engine import Engine
    from pipeline.answer.options import EngineOptions
    from pipeline.models.vocabulary import KeywordExpander
    from pipeline.store import Store


def ingest_options(settings: PipelineSettings) -> IngestOptions:
    from pipeline.ingest.storage import ParseLimits

    ing = settings.ingest
    return IngestOptions(
        max_page_bytes=ing.max_page_bytes,
        max_evidence_chars=ing.max_evidence_chars,
        max_evidence_per_page=ing.max_evidence_per_page,
        parse=ParseLimits(timeout_s=ing.page_timeout_s, max_table_cells=ing.max_table_cells,
                          min_coverage=ing.min_text_coverage),
        context_items=tuple(ing.context_items),
        context_item_max_chars=ing.context_item_max_chars,
        table_indexing=ing.table_indexing,
        linearization=ing.linearization,
        dense_context_items=ing.dense_context_items,
    )


def vocabulary_path(settings: PipelineSettings, index_dir: Path | None = None) -> Path | None:
    """Where the keyword-expansion vocabulary of the configured index lives (``<data dir>/vocabulary/``), or
    None when expansion is off or the sparse encoder is not BM25."""
    if settings.retrieval.keyword_weight <= 0 or settings.models.sparse_encoder != "bm25":
        return None
    return _vocabulary_file(settings, index_dir)


def _vocabulary_file(settings: PipelineSettings, index_dir: Path | None = None) -> Path:
    if settings.index.qdrant_url:
        name = f"qdrant-{settings.index.collection}"
    else:
        where = str(Path(index_dir or settings.core.resolved_index_dir).resolve())
        name = f"edge-{hashlib.sha1(where.encode()).hexdigest()[:12]}"
    return Path(settings.core.data_dir) / "vocabulary" / f"{name}.npz"


def make_expander_from(settings: PipelineSettings, embedder: Embedder, sparse: SparseEncoder,
                       index_dir: Path | None = None) -> KeywordExpander | None:
    """The keyword expander over the index's vocabulary (None when expansion is off)."""
    from pipeline.models.sparse import Bm25Encoder
    from pipeline.models.vocabulary import KeywordExpander

    path = vocabulary_path(settings, index_dir)
    if path is None or not isinstance(sparse, Bm25Encoder):
        return None
    return KeywordExpander(path, embedder, sparse)


def make_embedder_from(settings: PipelineSettings, *, cache: bool = True) -> Embedder:
    from pipeline.models.embedders import make_embedder
    from pipeline.models.openai_embedder import RemoteEmbedding

    m = settings.models
    remote = RemoteEmbedding(
        base_url=m.embed_base_url or "", api_key=m.embed_api_key.get_secret_value(),
        concurrency=m.embed_concurrency, max_request_tokens=m.embed_max_request_tokens,
        dimensions=m.embed_dimensions or None, query_prefix=m.embed_query_prefix,
        document_prefix=m.embed_document_prefix, api_version=m.embed_api_version,
    )
    embedder = make_embedder(
        m.embedder, batch_size=m.embed_batch_size, max_tokens=m.embed_max_tokens, runtime=m.embed_runtime,
        device=m.embed_device, precision=m.embed_precision, threads=m.embed_threads, remote=remote,
        process=m.embed_process,
    )
    if cache:
        from pipeline.models.embed_cache import CachedEmbedder

        embedder = CachedEmbedder(embedder, Path(settings.core.data_dir) / "cache")
    return embedder


def make_sparse_from(settings: PipelineSettings, embedder: Embedder | None = None) -> SparseEncoder:
    from pipeline.models.sparse import make_sparse_encoder

    # The cache wraps the model; bge-m3's sparse half must come from the model itself.
    return make_sparse_encoder(settings.models.sparse_encoder, embedder=getattr(embedder, "inner", embedder),
                               avg_len=settings.models.bm25_avg_len)


async def open_stack(
    settings: PipelineSettings,
    index_dir: Path | None = None,
    *,
    require_index: bool = False,
    serving: bool = False,
) -> tuple[Embedder, SparseEncoder, Index]:
    """Embedder, sparse encoder and an opened index: what every command that reads or writes the index needs.

    Opening checks the index was built with this embedder and dimension (``IndexMismatchError`` if not).
    ``require_index`` (commands that only read): a missing or empty index is an ``InputError`` that says
    so, instead of answers that "cannot be found".
    """
    embedder = await _load_embedder(settings)
    try:
        sparse = make_sparse_from(settings, embedder)
        index = await _open_index(
            settings, index_dir, embedder, sparse, require_index=require_index, serving=serving
        )
    except BaseException:
        # a worker process started for the model does not outlive a failed (or cancelled) open
        embedder.close()
        raise
    return embedder, sparse, index


async def _load_embedder(settings: PipelineSettings) -> Embedder:
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


async def _open_index(
    settings: PipelineSettings,
    index_dir: Path | None,
    embedder: Embedder,
    sparse: SparseEncoder,
    *,
    require_index: bool,
    serving: bool = False,
) -> Index:
    where = index_dir or settings.core.resolved_index_dir
    if require_index and not settings.index.qdrant_url and not (Path(where) / "manifest.json").is_file():
        raise InputError(
            f"no index at {where}: ingest pages first (evident ingest PATH, evident ingest --sample "
            "or evident sync), or point EVIDENT_DATA_DIR / --index-dir at the right one"
        )
    index = make_index_from(settings, index_dir, serving=serving)
    try:
        await index.open(
            dense_dim=embedder.dim, embedder=embedder.name, recipe=embedder_recipe(embedder, sparse)
        )
    except BaseException:
        await index.close()  # a client built for a server that refused us is closed, not left to the GC
        raise
    if require_index and await index.count() == 0:
        await index.close()
        what = (f"collection {settings.index.collection!r} at {settings.index.qdrant_url}"
                if settings.index.qdrant_url else f"index at {where}")
        raise InputError(f"the {what} is empty: ingest pages first (evident ingest PATH or evident sync)")
    return index


async def open_existing_index(settings: PipelineSettings) -> Index:
    """The configured index, opened without loading a model, for commands that only read or copy it (stats,
    migrate), with the recipe it records (its sparse vectors are read as they were made);
    ``InputError`` when the embedded index does not exist."""
    recipe = None  # a server's collection checks the recipe it records against none
    if not settings.index.qdrant_url:
        from pipeline.index.edge_manifest import read_recipe

        recipe = read_recipe(settings.core.resolved_index_dir)  # "no embedded index at ...": there is none
    dim, name = index_identity(settings)
    index = make_index_from(settings)
    try:
        await index.open(dense_dim=dim, embedder=name, recipe=recipe)
    except BaseException:
        await index.close()
        raise
    return index


async def drop_index(settings: PipelineSettings, index_dir: Path | None = None) -> None:
    """Delete the configured index (``--rebuild``), whatever embedder built it; it is created again on open.
    Its keyword-expansion vocabulary goes with it."""
    await make_index_from(settings, index_dir).drop()
    from pipeline.models.term_counts import TermCounts

    path = _vocabulary_file(settings, index_dir)  # whether expansion is on now or not
    for leftover in (path, TermCounts.path_for(path), TermCounts.pages_for(path)):
        await asyncio.to_thread(leftover.unlink, missing_ok=True)


def embedder_recipe(embedder: Embedder, sparse: SparseEncoder) -> dict[str, Any]:
    """How texts become vectors beyond the dense model's name: recorded with the index, checked on every open
    (vectors cut at another length, or sparse vectors of another encoder, must not be mixed)."""
    return {"max_tokens": int(getattr(embedder, "max_tokens", 0) or 0), "sparse": sparse.name,
            "sparse_idf": bool(sparse.idf)}


def index_identity(settings: PipelineSettings) -> tuple[int, str]:
    """(dimension, embedder name) to open the index with, for commands that never embed: the embedded
    index's manifest when there is one (no model load, and no mismatch for an index built with another
    embedder), else the configured embedder."""
    if not settings.index.qdrant_url:
        from pipeline.index.edge_manifest import read_manifest

        try:
            name, dim = read_manifest(settings.core.resolved_index_dir)
            return dim, name
        except EvidentError:
            pass
    embedder = make_embedder_from(settings, cache=False)
    return embedder.dim, embedder.name


def make_index_from(
    settings: PipelineSettings, index_dir: Path | None = None, *, serving: bool = False
) -> Index:
    """The configured index, unopened: a Qdrant server's collection, or the embedded one (in a worker
    process when ``EVIDENT_INDEX_PROCESS`` says so; ``auto``: for ``serving`` processes)."""
    ix = settings.index
    if ix.qdrant_url:
        from pipeline.index.qdrant import QdrantServerIndex

        return QdrantServerIndex(
            url=ix.qdrant_url,
            api_key=ix.qdrant_api_key.get_secret_value() or None,
            collection=ix.collection,
            shard_number=ix.shard_number,
            replication_factor=ix.replication_factor,
            write_consistency_factor=ix.write_consistency_factor,
        )
    path = Path(index_dir or settings.core.resolved_index_dir)
    if ix.index_process == "yes" or (ix.index_process == "auto" and serving):
        from pipeline.index.edge_worker import ProcessEdgeIndex

        # builds wait for quiet only while serving: a CLI command builds before it exits
        return ProcessEdgeIndex(path, wait_s=ix.index_wait_s,
                                build_quiet_s=ix.index_build_quiet_s if serving else 0.0,
                                build_max_pending=ix.index_build_max_pending, trace_file=ix.index_trace_file)
    from pipeline.index.edge import EdgeIndex

    return EdgeIndex(path, wait_s=ix.index_wait_s)


def make_store(settings: PipelineSettings) -> Store:
    """The SQLite conversation store (turns, feedback, checkpoints)."""
    from pipeline.store import Store

    return Store(settings.core.resolved_store_path)


def make_qdrant_client(settings: PipelineSettings) -> Any:
    """A synchronous ``qdrant_client.QdrantClient`` for the configured server (server-side snapshots)."""
    from qdrant_client import QdrantClient

    if not settings.index.qdrant_url:
        raise ConfigError("QDRANT_URL is not set")
    return QdrantClient(
        url=settings.index.qdrant_url,
        api_key=settings.index.qdrant_api_key.get_secret_value() or None,
        check_compatibility=False,
    )


def make_destination_index(settings: PipelineSettings, target: str, collection: str) -> Index:
    """``evident index migrate --to``: ``http(s)://host:port`` (a server), ``path:/dir`` (qdrant-client local
    mode) or ``:memory:``; the cluster settings apply to a server."""
    from pipeline.index.qdrant import QdrantServerIndex

    target = target.strip()
    ix = settings.index
    if target.startswith(("http://", "https://")):
        return QdrantServerIndex(url=target, api_key=ix.qdrant_api_key.get_secret_value() or None,
                                 collection=collection, shard_number=ix.shard_number,
                                 replication_factor=ix.replication_factor,
                                 write_consistency_factor=ix.write_consistency_factor)
    if target.startswith("path:") and target[5:].strip():
        return QdrantServerIndex(path=Path(target[5:].strip()).expanduser(), collection=collection)
    if target == ":memory:":
        return QdrantServerIndex(location=":memory:", collection=collection)
    raise InputError(f"--to {target!r}: use a Qdrant URL (http://host:6333), path:/some/dir or :memory:")


def make_reranker_from(settings: PipelineSettings, embedder: Embedder | None = None) -> Reranker | None:
    """The configured reranker (``sentences:dense`` scores with ``embedder``)."""
    from pipeline.models.rerank import make_reranker

    return make_reranker(settings.models.reranker, embedder=embedder)


def make_llm_from(settings: PipelineSettings) -> LLM | None:
    """None when no endpoint is configured: the engine then answers extractively, offline."""
    llm = settings.llm
    if not llm.base_url:
        return None
    from pipeline.models.llm import OpenAILLM

    return OpenAILLM(
        base_url=llm.base_url,
        api_key=llm.api_key.get_secret_value() or "not-needed",
        model_for=llm.model_for,
        timeout_s=llm.timeout_s,
        max_retries=llm.max_retries,
        concurrency=llm.concurrency,
    )


async def build_engine(
    settings: PipelineSettings,
    *,
    index_dir: Path | None = None,
    trace: bool = False,
    metrics: Metrics | None = None,
    require_index: bool = False,
    serving: bool = False,
) -> Engine:
    """Compose the conversation engine from settings (the CLI's and the bot's single entry point).

    ``serving``: a long-running bot process (``evident serve``), which gets the index in a worker process
    by default (``EVIDENT_INDEX_PROCESS``)."""
    from pipeline.answer.engine import Engine
    from pipeline.answer.prompts import PromptLibrary

    options = engine_options(settings, trace=trace)  # settings errors first, before anything is opened
    embedder, sparse, index = await open_stack(
        settings, index_dir, require_index=require_index, serving=serving
    )
    try:
        return Engine(
            index=index,
            embedder=embedder,
            sparse=sparse,
            store=make_store(settings),
            prompts=PromptLibrary(settings.answer.resolved_prompts_dir),
            retrieval=settings.retrieval,
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


def engine_options(settings: PipelineSettings, *, trace: bool = False) -> EngineOptions:
    """Engine options from settings, shared by the bot/CLI engine and the evaluation engine."""
    from pipeline.answer.options import EngineOptions

    method, llm = settings.attribution.method, settings.llm
    # Fail at start-up, not at the first explain request, when the default explain method cannot run.
    if method == "logprob" and not (llm.base_url and llm.prompt_logprobs):
        raise ConfigError("EVIDENT_ATTRIBUTION_METHOD=logprob needs EVIDENT_LLM_BASE_URL and "
                          "EVIDENT_LLM_PROMPT_LOGPROBS=true (a vLLM or llama.cpp server)")
    if llm.prompt_logprobs:
        from pipeline.answer.prompts import PromptLibrary

        PromptLibrary(settings.answer.resolved_prompts_dir).check(llm.raw_template)
    ing, answer = settings.ingest, settings.answer
    return EngineOptions(
        query_strategy=answer.query_strategy,
        history_turns=answer.history_turns,
        context_tokens=llm.context_tokens,
        answer_max_tokens=answer.answer_max_tokens,
        answer_style=answer.answer_style,
        answer_quotes=answer.answer_quotes,
        followup_retrieval=answer.followup_retrieval,
        attribution_method=method,
        attribution_params=settings.attribution.params(llm=bool(llm.base_url)),
        trace=trace,
        dense_context_items=ing.dense_context_items
        if ing.dense_context_items is not None
        else ing.context_items,
        context_item_max_chars=ing.context_item_max_chars,
        prompt_logprobs=llm.prompt_logprobs,
        raw_template=llm.raw_template,
        confident_k=answer.confident_k,
    )
