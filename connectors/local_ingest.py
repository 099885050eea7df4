"""`evident ingest` / `evident demo`: pages from a ``SourceConnector`` (export folders) into the index.

Folders are remembered (``pipeline.store.sources``): a page whose file was deleted, or that a file read in
full no longer holds, leaves the index at the folder's next ingest. Pages of files that failed to read this
time stay (their ids are unknown until they read again), and so do pages another folder also produced.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from connectors.local import LocalFolderConnector
from connectors.settings import ConnectorSettings
from pipeline.errors import InputError
from pipeline.factory import drop_index, ingest_options, make_store, open_stack, vocabulary_path
from pipeline.ingest.page_work import make_page_work
from pipeline.ingest.report import IngestReport
from pipeline.ingest.run import ingest_pages
from pipeline.ingest.vocabulary_run import VocabularyRun
from pipeline.protocols import Index, SourceConnector
from pipeline.store import Store
from pipeline.types import Page


@dataclass
class FolderReport:
    """What ``ingest_folders`` did: the ingest itself, the files it could not read, the pages it removed."""

    ingest: IngestReport
    failures: list[tuple[str, str]] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)


async def ingest_source(
    settings: ConnectorSettings,
    source: SourceConnector,
    *,
    progress: bool = False,
    rebuild: bool = False,
    then: Callable[[Index], Awaitable[Sequence[str]]] | None = None,
) -> IngestReport:
    """Index every page ``source`` yields, then run ``then`` with the still open index (it returns the pages
    it deleted). The first page is read before the model loads, so bad input fails at once, not after
    seconds; "no pages found" names the first file that failed and why."""

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
    work = make_page_work(settings.ingest, sparse)
    try:
        warnings: list[tuple[str, str]] = []
        async with VocabularyRun.held(vocabulary_path(settings), sparse, None, embedder, warnings) as words:
            report = await ingest_pages(all_pages(), index=index, embedder=embedder, sparse=sparse,
                                        options=ingest_options(settings), progress=progress, vocabulary=words,
                                        work=work)
            if then is not None:
                gone = await then(index)
                if words is not None:  # their words leave the vocabulary's counts
                    await words.forget(gone)
        report.warnings.extend(warnings)
        return report
    except InputError as exc:
        raise explained(exc) from exc
    finally:
        await work.close()  # stopping a worker process raises nothing
        await index.close()


async def ingest_folders(settings: ConnectorSettings, paths: Sequence[Path], *, space: str | None = None,
                         progress: bool = False, rebuild: bool = False,
                         base_url: str | None = None) -> FolderReport:
    """Index every page under ``paths`` and remove the pages of those folders whose files are gone."""
    source = LocalFolderConnector([Path(p) for p in paths], space=space,
                                  base_url=base_url or settings.local.base_url)
    deleted: list[str] = []
    store = make_store(settings)

    async def forget_gone(index: Index) -> list[str]:
        deleted.extend(await _forget_gone(store, source, index))
        return deleted

    try:
        ingest = await ingest_source(settings, source, progress=progress, rebuild=rebuild, then=forget_gone)
    finally:
        await store.close()
    return FolderReport(ingest, list(source.failures), deleted)


async def _forget_gone(store: Store, source: LocalFolderConnector, index: Index) -> list[str]:
    gone: list[str] = []
    keep_by_root: dict[str, dict[str, str]] = {}
    for root in source.paths:
        key = f"local:{root.resolve()}"
        before = await store.source_pages(key)
        lost, keep_by_root[key] = await asyncio.to_thread(_split_lost, before, source, root)
        gone += sorted(set(lost) - await store.claimed_elsewhere(key, lost))
    if gone:
        await index.delete_pages(gone)
    for key, pages in keep_by_root.items():
        await store.set_source_pages(key, pages)
    return gone


def _split_lost(
    before: dict[str, str], source: LocalFolderConnector, root: Path
) -> tuple[list[str], dict[str, str]]:
    """(lost, kept) for one folder (file checks: run in a thread). Lost: pages it produced last time and not
    this time whose file is gone or was read in full without them. Kept: this run's pages from the folder,
    plus last time's pages whose file failed to read this time."""
    lost: list[str] = []
    kept: dict[str, str] = {}
    for pid, f in before.items():
        if pid in source.origins:
            continue
        if f in source.read_files or not Path(f).exists():
            lost.append(pid)
        else:
            kept[pid] = f
    single = root.is_file()
    kept.update({pid: f for pid, f in source.origins.items()
                 if (Path(f) == root if single else Path(f).is_relative_to(root))})
    return lost, kept
