"""`evident ingest` / `evident demo`: export folders into the index, with the first bad file named."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from pathlib import Path

from connectors.local import LocalFolderConnector
from pipeline.errors import InputError
from pipeline.factory import drop_index, ingest_options, open_stack
from pipeline.ingest.run import IngestReport, ingest_pages
from pipeline.runtime.settings import Settings
from pipeline.types import Page


async def ingest_folders(settings: Settings, paths: Sequence[Path], *, space: str | None = None,
                         progress: bool = False, rebuild: bool = False) -> tuple[IngestReport, list[tuple[str, str]]]:
    """Index every page under ``paths``; returns the report and the files that could not be read."""
    connector = LocalFolderConnector([Path(p) for p in paths], space=space)

    def explained(exc: InputError) -> InputError:
        # "no pages found (3 files failed)" alone hides why: name the first failing file and its reason.
        if not connector.failures:
            return exc
        where, reason = connector.failures[0]
        return InputError(f"{exc}; {where}: {reason}")

    # Read the first page before loading the model, so bad input fails at once, not after seconds.
    pages = connector.iter_pages()
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
        report = await ingest_pages(all_pages(), index=index, embedder=embedder, sparse=sparse,
                                    options=ingest_options(settings), progress=progress)
    except InputError as exc:
        raise explained(exc) from exc
    finally:
        await index.close()
    return report, list(connector.failures)
