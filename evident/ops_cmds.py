"""Operations commands: ``evident backup``, ``evident restore`` and ``evident index migrate``.

Backup and restore work on files, not on open clients: stop ``evident serve`` (and any other process
using the embedded index) first. This process opens nothing while it copies, so the embedded Qdrant
Edge directory is copied as the last process that closed it left it (closed = flushed); the SQLite
store is copied with SQLite's online backup API, which is consistent even if a bot still writes.
``evident/backup.py`` does blocking file I/O, so it runs in a worker thread.

``index migrate`` copies the live points of an embedded index (vectors, sparse vectors and payloads
exactly as stored, no re-embedding) into a Qdrant collection through qdrant-client, page by page
with ``replace_page``, so it is resumable: pages already there with the same content hash are skipped.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from pipeline.runtime.settings import Settings
from pipeline.types import Hit

if TYPE_CHECKING:  # qdrant-client takes seconds to import: only the commands that need it load it
    from pipeline.index.edge import EdgeIndex
    from pipeline.protocols import Index

VERIFY_K = 10


def _settings(ctx: click.Context, index_dir: Path | None) -> Settings:
    settings: Settings = ctx.obj["settings"]
    return settings.replace(index_dir=index_dir) if index_dir is not None else settings


def _human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"  # pragma: no cover - loop always returns


# ---------------------------------------------------------------- backup / restore


async def run_backup(settings: Settings, dest: Path) -> Any:
    """Back up the store and the embedded index (or snapshot the Qdrant server collection)."""
    from evident import backup as backup_mod

    qdrant = None
    index_dir: Path | None = None
    if settings.qdrant_url:
        from pipeline.factory import make_qdrant_client

        qdrant = make_qdrant_client(settings)
    elif settings.resolved_index_dir.is_dir():
        index_dir = settings.resolved_index_dir
    try:
        async with _index_lease(settings, index_dir, "evident backup"):
            return await asyncio.to_thread(backup_mod.backup, dest, store_path=settings.resolved_store_path,
                                           index_dir=index_dir, qdrant=qdrant, collection=settings.collection)
    finally:
        if qdrant is not None:
            qdrant.close()


@contextlib.asynccontextmanager
async def _index_lease(settings: Settings, index_dir: Path | None, command: str) -> AsyncIterator[None]:
    """Hold the embedded index's lease: a running `evident serve` hands its shard over meanwhile."""
    if index_dir is None:
        yield
        return
    from pipeline.index.lease import IndexLease

    lease = IndexLease(index_dir, command=command, wait_s=settings.index_wait_s)
    await asyncio.to_thread(lease.acquire)
    try:
        yield
    finally:
        lease.release()


async def run_restore(settings: Settings, src: Path, *, force: bool) -> Any:
    from evident import backup as backup_mod

    index_dir = None if settings.qdrant_url else settings.resolved_index_dir
    async with _index_lease(settings, index_dir, "evident restore"):
        return await asyncio.to_thread(backup_mod.restore, src, store_path=settings.resolved_store_path,
                                       index_dir=index_dir, force=force)


# ---------------------------------------------------------------- index migrate


@dataclass
class MigrateReport:
    source: str
    destination: str
    pages_copied: int = 0
    pages_skipped: int = 0  # already in the destination with the same content hash
    pages_deleted: int = 0  # in the destination but not in the source (only with --force)
    points_copied: int = 0
    source_points: int = 0
    destination_points: int = 0
    verified: list[bool] = field(default_factory=list)  # per sample query: same top-k up to ties

    def summary(self) -> str:
        same = sum(self.verified)
        return (f"migrated {self.source} -> {self.destination}: {self.pages_copied} pages copied "
                f"({self.points_copied} points), {self.pages_skipped} unchanged, {self.pages_deleted} deleted; "
                f"points: source {self.source_points}, destination {self.destination_points}; "
                f"same top-{VERIFY_K} for {same}/{len(self.verified)} sample queries")


def read_edge_manifest(index_dir: Path) -> tuple[str, int]:
    """(embedder, dim) an embedded index was built with, so migrating needs no embedding model."""
    from pipeline.errors import IndexError_, InputError
    from pipeline.index.edge import MANIFEST_FILE

    path = Path(index_dir) / MANIFEST_FILE
    if not path.is_file():
        raise InputError(f"no embedded index at {index_dir} (no {MANIFEST_FILE}); nothing to migrate")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return str(data["embedder"]), int(data["dim"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise IndexError_(f"cannot read {path}: {exc}") from exc


async def migrate_index(source_dir: Path, dest: Index, *, batch: int = 256, force: bool = False, verify: int = 5,
                        progress: Callable[[str], None] | None = None) -> MigrateReport:
    """Copy every live page of the Edge index at ``source_dir`` into ``dest`` (an unopened ``Index``)."""
    from pipeline.errors import IndexError_, InputError
    from pipeline.index.edge import EdgeIndex
    from pipeline.types import IndexPoint

    embedder, dim = read_edge_manifest(source_dir)
    source = EdgeIndex(source_dir)
    await source.open(dense_dim=dim, embedder=embedder)
    report = MigrateReport(source=f"edge index {source_dir}", destination=str(getattr(dest, "where", dest)))
    try:
        await dest.open(dense_dim=dim, embedder=embedder)
        try:
            src_pages = await source.page_hashes()
            dst_pages = await dest.page_hashes()
            extra = sorted(set(dst_pages) - set(src_pages))
            if extra and not force:
                raise InputError(f"{report.destination} has {len(extra)} pages that the source lacks; "
                                 "pass --force to delete them")
            todo = {pid for pid, h in src_pages.items() if dst_pages.get(pid) != h}
            report.pages_skipped = len(src_pages) - len(todo)
            page: list[IndexPoint] = []

            async def flush() -> None:
                if page:
                    await dest.replace_page(page[0].evidence.page_id, page[0].page_hash, list(page))
                    report.pages_copied += 1
                    report.points_copied += len(page)
                    page.clear()
                    if progress and report.pages_copied % 100 == 0:
                        progress(f"{report.pages_copied}/{len(todo)} pages")

            async for point in source.export_points(batch=batch, page_ids=sorted(todo)):
                if page and point.evidence.page_id != page[0].evidence.page_id:
                    await flush()
                page.append(point)
            await flush()
            if extra:
                await dest.delete_pages(extra)
                report.pages_deleted = len(extra)
            report.source_points = await source.count()
            report.destination_points = await dest.count()
            if report.source_points != report.destination_points:
                raise IndexError_(f"after migrating, the source has {report.source_points} points but "
                                  f"{report.destination} has {report.destination_points}")
            report.verified = await _verify_top_k(source, dest, verify, batch)
        finally:
            await dest.close()
    finally:
        await source.close()
    return report


async def _verify_top_k(source: EdgeIndex, dest: Index, n: int, batch: int) -> list[bool]:
    """Query both indexes with the vectors of ``n`` stored points; True where both legs rank alike.

    The lexical and dense legs are compared separately: hybrid results fuse their ranks, so a tie that
    the two backends break differently in one leg shifts fused scores without anything being wrong.
    """
    from dataclasses import replace

    from pipeline.types import SearchRequest

    if n <= 0:
        return []
    pages = sorted(await source.page_hashes())
    picked = pages[:: max(1, len(pages) // n)][:n]
    out: list[bool] = []
    for pid in picked:
        async for point in source.export_points(batch=batch, page_ids=[pid]):
            base = SearchRequest(dense=point.dense, sparse=point.sparse, lexical_k=VERIFY_K, dense_k=VERIFY_K,
                                 limit=VERIFY_K)
            same = True
            for mode in ("lexical", "dense"):
                req = replace(base, mode=mode)  # type: ignore[arg-type]
                same = same and same_ranking(await source.search(req), await dest.search(req))
            out.append(same)
            break
    return out


def _tie_groups(hits: Sequence[Hit], rel: float) -> list[tuple[float, set[str]]]:
    groups: list[tuple[float, set[str]]] = []
    for h in hits:
        if groups and abs(h.score - groups[-1][0]) <= rel * max(1.0, abs(h.score)):
            groups[-1][1].add(h.evidence.id)
        else:
            groups.append((h.score, {h.evidence.id}))
    return groups


def same_ranking(a: Sequence[Hit], b: Sequence[Hit], *, rel: float = 1e-4) -> bool:
    """Whether two result lists rank alike up to ties.

    Qdrant orders equal scores arbitrarily (differently per backend, even between two opens of one Edge
    index), so ids are compared per group of (nearly) equal scores; the last group, which the limit may
    cut anywhere, is compared by its score only.
    """
    ga, gb = _tie_groups(a, rel), _tie_groups(b, rel)
    if len(a) != len(b) or len(ga) != len(gb):
        return False
    for i, ((sa, ida), (sb, idb)) in enumerate(zip(ga, gb, strict=True)):
        if abs(sa - sb) > rel * max(1.0, abs(sa)) or (i < len(ga) - 1 and ida != idb):
            return False
    return True


# ---------------------------------------------------------------- commands


def register(main: click.Group) -> None:
    """Add the operations commands to ``evident`` (``index migrate`` goes under the ``index`` group)."""
    index_dir_option = click.option("--index-dir", type=click.Path(path_type=Path), default=None,
                                    help="Embedded index directory (default DATA_DIR/index).")

    @main.command()
    @click.argument("dest", type=click.Path(path_type=Path))
    @index_dir_option
    @click.pass_context
    def backup(ctx: click.Context, dest: Path, index_dir: Path | None) -> None:
        """Back up the store and the index into DEST (absent or empty).

        Stop `evident serve` first: the embedded index directory is copied file by file. With
        QDRANT_URL the server snapshots the collection instead (the snapshot stays on the server).
        """
        from evident.cli import cli_errors

        @cli_errors
        def go() -> None:
            manifest = asyncio.run(run_backup(_settings(ctx, index_dir), dest))
            index_bytes = sum(e.bytes for e in manifest.index)
            parts = [f"store {_human(manifest.store.bytes)}"]
            if manifest.index:
                parts.append(f"index {len(manifest.index)} files, {_human(index_bytes)}")
            if manifest.qdrant_snapshot:
                parts.append(f"qdrant snapshot {manifest.qdrant_snapshot.get('name')} (on the server)")
            click.echo(f"backup {dest}: {', '.join(parts)} in {manifest.duration_s:.1f} s")

        go()

    @main.command()
    @click.argument("src", type=click.Path(path_type=Path, exists=True, file_okay=False))
    @click.option("--force", is_flag=True, help="Overwrite an existing store / index.")
    @index_dir_option
    @click.pass_context
    def restore(ctx: click.Context, src: Path, force: bool, index_dir: Path | None) -> None:
        """Restore a backup from SRC (verifies checksums first). Stop `evident serve` first."""
        from evident.cli import cli_errors

        @cli_errors
        def go() -> None:
            settings = _settings(ctx, index_dir)
            manifest = asyncio.run(run_restore(settings, src, force=force))
            where = f"store {settings.resolved_store_path}"
            if manifest.index and not settings.qdrant_url:
                where += f", index {settings.resolved_index_dir}"
            click.echo(f"restored backup of {manifest.created_at}: {where}")
            if manifest.qdrant_snapshot:
                click.echo(f"note: restore Qdrant snapshot {manifest.qdrant_snapshot.get('name')} of collection "
                           f"{manifest.qdrant_snapshot.get('collection')} on the server yourself", err=True)

        go()

    index_group = main.commands.get("index")
    if not isinstance(index_group, click.Group):
        return

    @index_group.command("migrate")
    @click.option("--to", "target", required=True,
                  help="Qdrant URL (http://host:6333), path:/dir (qdrant-client local mode) or :memory:.")
    @click.option("--collection", default=None, help="Destination collection (default EVIDENT_COLLECTION).")
    @click.option("--force", is_flag=True, help="Delete destination pages the source does not have.")
    @click.option("--batch", default=256, show_default=True, help="Points per read from the embedded index.")
    @click.option("--verify", default=5, show_default=True, help="Sample queries compared after copying.")
    @index_dir_option
    @click.pass_context
    def index_migrate(ctx: click.Context, target: str, collection: str | None, force: bool, batch: int,
                      verify: int, index_dir: Path | None) -> None:
        """Copy the embedded index into a Qdrant collection (no re-embedding; resumable)."""
        from evident.cli import cli_errors

        @cli_errors
        def go() -> None:
            from pipeline.factory import make_destination_index

            settings = _settings(ctx, index_dir)
            dest = make_destination_index(settings, target, collection or settings.collection)
            report = asyncio.run(migrate_index(settings.resolved_index_dir, dest, batch=batch, force=force,
                                               verify=verify, progress=lambda m: click.echo(m, err=True)))
            click.echo(report.summary())
            if not all(report.verified):
                click.echo("warning: some sample queries ranked differently (approximate HNSW search on the "
                           "server can cause this)", err=True)

        go()
