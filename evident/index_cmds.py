"""`evident ingest`, `evident search` and `evident index stats|migrate`."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from evident.access_cli import as_option, scope_for
from evident.common import cli_errors, echo_page_problems, index_dir_option, load_settings, run
from evident.settings import Settings
from pipeline.errors import InputError


@click.command()
@click.argument("paths", nargs=-1, type=click.Path(path_type=Path))
@click.option("--space", default=None, help="Override the space key of every page.")
@index_dir_option
@click.option("--sample", is_flag=True, help="Ingest the bundled sample space.")
@click.option("--no-progress", is_flag=True, help="No progress bar (evidence embedded, rate, ETA).")
@click.option("--rebuild", is_flag=True,
              help="Delete the index first (another embedder or recipe); every page is embedded again.")
@click.option("--base-url", default=None,
              help="Where the files are published: cite this URL plus each file's path "
                   "(EVIDENT_LOCAL_BASE_URL).")
@click.pass_context
@cli_errors
def ingest(ctx: click.Context, paths: tuple[Path, ...], space: str | None, index_dir: Path | None,
           sample: bool, no_progress: bool, rebuild: bool, base_url: str | None) -> None:
    """Index pages from folders: Confluence exports (ConfQuestions-style JSON, HTML), Markdown, text, PDF and
    Word (.docx). Pages whose files were deleted since the folder's last ingest leave the index."""
    from connectors.local import sample_space_dir
    from connectors.local_ingest import ingest_folders

    settings = load_settings(ctx, index_dir=index_dir)
    if sample:
        paths = (*paths, sample_space_dir())
    if not paths:
        raise InputError("give at least one PATH to ingest (or --sample for the bundled sample space)")
    missing = [str(p) for p in paths if not Path(p).expanduser().exists()]
    if missing:
        raise InputError(f"path not found: {', '.join(missing)}")
    done = run(ingest_folders(settings, paths, space=space, progress=not no_progress, rebuild=rebuild,
                              base_url=base_url))
    report, failures = done.ingest, done.failures
    kinds = ", ".join(f"{k} {v}" for k, v in report.evidence_by_kind.items()) or "none"
    partial = f", partial {len({pid for pid, _ in report.partial})}" if report.partial else ""
    click.echo(
        f"pages {report.pages_seen} (added {report.added}, updated {report.updated}, unchanged "
        f"{report.unchanged}, deleted {len(done.deleted)}, failed "
        f"{len(report.failed) + len(failures)}{partial}) · "
        f"evidence {report.evidence} ({kinds}) · {report.seconds:.1f} s · index "
        f"{settings.core.resolved_index_dir}"
    )
    echo_page_problems([*failures, *report.failed], report.partial, report.warnings)
    if report.failed or failures or report.partial:
        sys.exit(1)


async def _search(settings: Settings, query: str, k: int, mode: str | None, as_email: str | None) -> Any:
    from pipeline.answer.retrieve import retrieve
    from pipeline.factory import make_expander_from, make_reranker_from, open_stack
    from pipeline.store import Store

    store = await Store.open(settings.core.resolved_store_path)
    try:
        scope = await scope_for(settings, store, as_email)
    finally:
        await store.close()
    embedder, sparse, index = await open_stack(settings, require_index=True)
    try:
        cfg = settings.replace(final_k=k, **({"retrieval_mode": mode} if mode else {})).retrieval
        return await retrieve(query, scope=scope, index=index, embedder=embedder, sparse=sparse, config=cfg,
                              reranker=make_reranker_from(settings, embedder),
                              expander=make_expander_from(settings, embedder, sparse))
    finally:
        await index.close()


@click.command()
@click.argument("query")
@click.option("-k", default=10, show_default=True, help="How many evidence to show.")
@click.option("--mode", type=click.Choice(["lexical", "dense", "hybrid"]), default=None)
@click.option("--json", "as_json", is_flag=True)
@as_option
@index_dir_option
@click.pass_context
@cli_errors
def search(ctx: click.Context, query: str, k: int, mode: str | None, as_json: bool, as_email: str | None,
           index_dir: Path | None) -> None:
    """Retrieve evidence for QUERY (no answer generation)."""
    if not query.strip():
        raise InputError("the query is empty")
    result = run(_search(load_settings(ctx, index_dir=index_dir), query, k, mode, as_email))
    if as_json:
        click.echo(json.dumps({
            "query": query,
            "timings_ms": result.timings_ms,
            "hits": [{"rank": h.rank, "score": h.score, "kind": h.evidence.kind, "title": h.evidence.title,
                      "url": h.evidence.url, "evidence_id": h.evidence.id, "content": h.content}
                     for h in result.hits],
        }, ensure_ascii=False, indent=2))
        return
    for h in result.hits:
        click.echo(f"{h.rank:>2}. {h.score:.4f} {h.evidence.kind:<7} {h.evidence.title} <{h.evidence.url}>")
        click.echo("    " + (h.content or h.evidence.text).replace("\n", "\n    ")[:600])
    click.echo(f"({sum(result.timings_ms.values()):.1f} ms)")


@click.group("index")
def index_group() -> None:
    """Inspect or move the evidence index."""


@index_group.command("stats")
@index_dir_option
@click.pass_context
@cli_errors
def index_stats(ctx: click.Context, index_dir: Path | None) -> None:
    """Points, pages, evidence by kind, size on disk."""
    from pipeline.factory import open_existing_index

    settings = load_settings(ctx, index_dir=index_dir)

    async def go() -> dict[str, object]:
        idx = await open_existing_index(settings)
        try:
            return await idx.stats()
        finally:
            await idx.close()

    click.echo(json.dumps(run(go()), indent=2, default=str))


@index_group.command("migrate")
@click.option("--to", "target", required=True,
              help="Qdrant URL (http://host:6333), path:/dir (qdrant-client local mode) or :memory:.")
@click.option("--collection", default=None, help="Destination collection (default EVIDENT_COLLECTION).")
@click.option("--force", is_flag=True, help="Delete destination pages the source does not have.")
@click.option("--batch", default=256, show_default=True, help="Points per read from the embedded index.")
@click.option("--verify", default=5, show_default=True, help="Sample queries compared after copying.")
@index_dir_option
@click.pass_context
@cli_errors
def index_migrate(ctx: click.Context, target: str, collection: str | None, force: bool, batch: int,
                  verify: int, index_dir: Path | None) -> None:
    """Copy the embedded index into a Qdrant collection (no re-embedding; resumable)."""
    from pipeline.factory import index_identity, make_destination_index, open_existing_index
    from pipeline.index.migrate import MigrateReport, migrate_index

    settings = load_settings(ctx, index_dir=index_dir)
    dest = make_destination_index(settings, target, collection or settings.index.collection)

    async def go() -> MigrateReport:
        dim, name = index_identity(settings)
        source = await open_existing_index(settings)
        try:
            return await migrate_index(source, dest, dim=dim, embedder=name, batch=batch, force=force,
                                       verify=verify, progress=lambda m: click.echo(m, err=True),
                                       source_name=_where(settings))
        finally:
            await source.close()

    report = run(go())
    click.echo(report.summary())
    if not all(report.verified):
        click.echo("warning: some sample queries ranked differently (approximate HNSW search on the "
                   "server can cause this)", err=True)


def _where(settings: Settings) -> str:
    if settings.index.qdrant_url:
        return f"collection '{settings.index.collection}' at {settings.index.qdrant_url}"
    return f"edge index {settings.core.resolved_index_dir}"
