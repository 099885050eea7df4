"""`evident sync`: Confluence -> index (the work is in ``connectors.confluence.run``)."""

from __future__ import annotations

import sys

import click

from evident.common import cli_errors, echo_page_problems, load_settings, run


@click.command()
@click.option("--space", "spaces", multiple=True, help="Space key (repeatable); default CONFLUENCE_SPACES.")
@click.option("--full", is_flag=True, help="Ignore checkpoints and re-list every page.")
@click.option("--rebuild", is_flag=True,
              help="Delete the index first (another embedder or recipe) and sync everything "
                   "(implies --full).")
@click.pass_context
@cli_errors
def sync(ctx: click.Context, spaces: tuple[str, ...], full: bool, rebuild: bool) -> None:
    """Sync Confluence spaces (Cloud or Data Center) into the index."""
    from connectors.confluence.run import run_sync, summary

    report = run(run_sync(load_settings(ctx), spaces=spaces or None, full=full or rebuild, progress=True,
                          rebuild=rebuild))
    click.echo(summary(report))
    echo_page_problems(report.failed, report.partial, report.warnings)
    if report.failed or report.partial:
        sys.exit(1)
