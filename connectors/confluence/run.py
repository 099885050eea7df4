"""One Confluence sync from the settings: what `evident sync` and `evident serve`'s sync loop run."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from connectors.confluence.sync import SyncReport, sync_confluence
from connectors.factory import make_confluence_source
from connectors.settings import ConnectorSettings
from pipeline.errors import ConfigError
from pipeline.factory import drop_index, ingest_options, make_store, open_stack, vocabulary_path
from pipeline.ingest.page_work import PageWork, make_page_work
from pipeline.ingest.vocabulary_run import KeptCounts
from pipeline.protocols import Embedder, Index, SparseEncoder
from pipeline.runtime.foreground import Foreground
from pipeline.store import Store


class EngineParts(Protocol):
    """The open components a running engine lends to a sync (``evident serve``)."""

    @property
    def embedder(self) -> Embedder: ...
    @property
    def sparse(self) -> SparseEncoder: ...
    @property
    def index(self) -> Index: ...
    @property
    def store(self) -> Store: ...
    @property
    def foreground(self) -> Foreground: ...


def check_sync_settings(settings: ConnectorSettings, spaces: Sequence[str] | None) -> None:
    if not settings.confluence.url:
        raise ConfigError("CONFLUENCE_URL missing: set it (Cloud: https://<site>.atlassian.net/wiki)")
    if not settings.confluence.token:
        raise ConfigError(
            "CONFLUENCE_TOKEN missing: a Cloud API token (with CONFLUENCE_USER) or a Data Center PAT"
        )
    if not (spaces or settings.confluence.spaces):
        raise ConfigError("no spaces to sync: set CONFLUENCE_SPACES or pass --space KEY")


async def run_sync(settings: ConnectorSettings, *, spaces: Sequence[str] | None, full: bool, progress: bool,
                   engine: EngineParts | None = None, rebuild: bool = False,
                   work: PageWork | None = None, kept: KeptCounts | None = None) -> SyncReport:
    """One sync. Reuses the engine's index, embedder and store when given, else opens (and closes) its own;
    ``work`` (``make_page_work``) likewise. ``kept``: a sync loop's vocabulary counts (``KeptCounts``)."""
    check_sync_settings(settings, spaces)
    source = make_confluence_source(settings)
    try:
        if engine is not None:
            report = await sync_confluence(
                source=source,
                index=engine.index,
                embedder=engine.embedder,
                sparse=engine.sparse,
                store=engine.store,
                options=ingest_options(settings),
                full=full,
                spaces=list(spaces) if spaces else None,
                progress=progress,
                vocabulary=vocabulary_path(settings),
                step_aside=engine.foreground.step_aside,  # questions first
                work=work,
                kept=kept,
            )
            await engine.store.record_sync(
                source.source_key, summary(report), [*report.failed, *report.partial]
            )
            return report
        if rebuild:
            await drop_index(settings)
        embedder, sparse, index = await open_stack(settings)
        store = make_store(settings)
        own = work or make_page_work(settings.ingest, sparse)
        try:
            report = await sync_confluence(
                source=source, index=index, embedder=embedder, sparse=sparse, store=store,
                options=ingest_options(settings), full=full, spaces=list(spaces) if spaces else None,
                progress=progress, vocabulary=vocabulary_path(settings), work=own, kept=kept,
            )
            await store.record_sync(source.source_key, summary(report), [*report.failed, *report.partial])
            return report
        finally:
            if work is None:
                await own.close()  # stopping a worker process is bounded and raises nothing
            try:
                await index.close()
            finally:
                await store.close()
    finally:
        source.close()


def summary(report: SyncReport) -> str:
    partial = f", partial {len(report.partial)}" if report.partial else ""
    return (
        f"added {report.added}, updated {report.updated}, deleted {report.deleted}, unchanged "
        f"{report.unchanged}, "
        f"skipped-restricted {report.skipped_restricted}, failed {len(report.failed)}{partial}, "
        f"API calls {report.api_calls}, {report.seconds:.1f} s, spaces listed {report.listed}"
    )
