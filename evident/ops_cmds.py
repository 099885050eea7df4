"""`evident backup` and `evident restore` (the work is in ``pipeline.backup``).

Backup and restore work on files, not on open clients: stop ``evident serve`` first, or let it hand the
embedded index over (the index lease). The SQLite store is copied with SQLite's online backup API.
"""

from __future__ import annotations

from pathlib import Path

import click

from evident.common import cli_errors, human_bytes, index_dir_option, load_settings, run


@click.command()
@click.argument("dest", type=click.Path(path_type=Path))
@index_dir_option
@click.pass_context
@cli_errors
def backup(ctx: click.Context, dest: Path, index_dir: Path | None) -> None:
    """Back up the store and the index into DEST (absent or empty).

    Stop `evident serve` first: the embedded index directory is copied file by file. With
    QDRANT_URL the server snapshots the collection instead (the snapshot stays on the server).
    """
    from pipeline.backup import backup_data

    manifest = run(backup_data(load_settings(ctx, index_dir=index_dir), dest))
    index_bytes = sum(e.bytes for e in manifest.index)
    parts = [f"store {human_bytes(manifest.store.bytes)}"]
    if manifest.index:
        parts.append(f"index {len(manifest.index)} files, {human_bytes(index_bytes)}")
    if manifest.qdrant_snapshot:
        parts.append(f"qdrant snapshot {manifest.qdrant_snapshot.get('name')} (on the server)")
    click.echo(f"backup {dest}: {', '.join(parts)} in {manifest.duration_s:.1f} s")


@click.command()
@click.argument("src", type=click.Path(path_type=Path, exists=True, file_okay=False))
@click.option("--force", is_flag=True, help="Overwrite an existing store / index.")
@index_dir_option
@click.pass_context
@cli_errors
def restore(ctx: click.Context, src: Path, force: bool, index_dir: Path | None) -> None:
    """Restore a backup from SRC (verifies checksums first). Stop `evident serve` first."""
    from pipeline.backup import restore_data

    settings = load_settings(ctx, index_dir=index_dir)
    manifest = run(restore_data(settings, src, force=force))
    where = f"store {settings.core.resolved_store_path}"
    if manifest.index and not settings.index.qdrant_url:
        where += f", index {settings.core.resolved_index_dir}"
    click.echo(f"restored backup of {manifest.created_at}: {where}")
    if manifest.qdrant_snapshot:
        click.echo(f"note: restore Qdrant snapshot {manifest.qdrant_snapshot.get('name')} of collection "
                   f"{manifest.qdrant_snapshot.get('collection')} on the server yourself", err=True)
