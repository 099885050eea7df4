"""`evident ingest` / `evident demo`: pages from a ``SourceConnector`` (export folders) into the index."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from pathlib import Path

from connectors.local import LocalFolderConnector
from pipeline.errors import InputError
from pipeline.factory import drop_index, ingest_options, open_stack
from pipeline.ingest.run import IngestReport, ingest_pages
from pipeline.protocols import SourceConnector
from pipeline.runtime.settings import Settings
from pipeline.types import Page


async def ingest_source(settings: Settings, source: SourceConnector, *, progress: bool = False,
                        rebuild: bool = False) -> IngestReport:
    """Index every page ``source`` yields. The first page is read before the model loads, so bad input fails
    at once, not after seconds; "no pages found" names the first file that failed and why."""

    def explained(exc: InputError) -> InputError:
        if not source.failures:
            return exc
        where, reason = source.failures[0]
        return InputError(f"{exc}; {where}: {reason}")

    pages = source.iter_pages()
    try:
        first = await anext(pages)
    except InputError as exc:
        raise explained(exc) from exc

    async def all_pages() -> AsyncIterator[Page]:
        yield first
        async for page in pages:
            yield page

    if rebuild:
        await drop_index(settings)
    embedder, sparse, index = await open_stack(settings)
    try:
        return await ingest_pages(all_pages(), index=index, embedder=embedder, sparse=sparse,
                                  options=ingest_options(settings), progress=progress)
    except InputError as exc:
        raise explained(exc) from exc
    finally:
        await index.close()


async def ingest_folders(settings: Settings, paths: Sequence[Path], *, space: str | None = None,
                         progress: bool = False, rebuild: bool = False) -> tuple[IngestReport, list[tuple[str, str]]]:
    """Index every page under ``paths``; returns the report and the files that could not be read."""
    source = LocalFolderConnector([Path(p) for p in paths], space=space)
    report = await ingest_source(settings, source, progress=progress, rebuild=rebuild)
    return report, list(source.failures)
