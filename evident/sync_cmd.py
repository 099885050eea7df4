"""`evident sync`: Confluence -> index, with the report the CLI prints."""

from __future__ import annotations

from collections.abc import Sequence

from pipeline.runtime.settings import Settings


def summary(report) -> str:  # type: ignore[no-untyped-def]
    partial = f", partial {len(report.partial)}" if report.partial else ""
    return (
        f"added {report.added}, updated {report.updated}, deleted {report.deleted}, unchanged {report.unchanged}, "
        f"skipped-restricted {report.skipped_restricted}, failed {len(report.failed)}{partial}, "
        f"API calls {report.api_calls}, {report.seconds:.1f} s"
    )


async def run_sync(settings: Settings, *, spaces: Sequence[str] | None, full: bool, progress: bool,  # type: ignore[no-untyped-def]
                   engine=None, rebuild: bool = False):
    """One sync. Reuses the engine's index/embedder/store when given (``evident serve``)."""
    from connectors.confluence.sync import sync_confluence
    from connectors.factory import make_confluence_source
    from pipeline.errors import ConfigError
    from pipeline.factory import ingest_options, make_store, open_stack

    if not settings.confluence_url:
        raise ConfigError("CONFLUENCE_URL missing: set it (Cloud: https://<site>.atlassian.net/wiki)")
    if not settings.confluence_token:
        raise ConfigError("CONFLUENCE_TOKEN missing: a Cloud API token (with CONFLUENCE_USER) or a Data Center PAT")
    if not (spaces or settings.confluence_spaces):
        raise ConfigError("no spaces to sync: set CONFLUENCE_SPACES or pass --space KEY")
    source = make_confluence_source(settings)
    own = engine is None
    if own:
        if rebuild:
            from pipeline.factory import drop_index

            await drop_index(settings)
        embedder, sparse, index = await open_stack(settings)
        store = make_store(settings)
    else:
        embedder, sparse, index, store = engine.embedder, engine.sparse, engine.index, engine.store
    try:
        report = await sync_confluence(
            source=source, index=index, embedder=embedder, sparse=sparse, store=store,
            options=ingest_options(settings), full=full, spaces=list(spaces) if spaces else None,
            progress=progress,
        )
    finally:
        close = getattr(source, "aclose", None) or getattr(source, "close", None)
        if close is not None:
            res = close()
            if hasattr(res, "__await__"):
                await res
        if own:
            await index.close()
            await store.close()
    return report
