"""`evident` command line: the composition root. Each command parses its arguments and calls a library
function; user errors print one line and exit non-zero (2: bad input or config, 1: partial results), no
tracebacks. Heavy imports (torch, qdrant-client) happen inside the commands that need them."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from evident.ask_cmds import ask, chat, demo, explain
from evident.eval_cmds import eval_group
from evident.index_cmds import index_group, ingest, search
from evident.ops_cmds import backup, restore
from evident.serve_cmd import serve
from evident.settings import Settings
from evident.sync_cmd import sync
from evident.teams_cmds import teams_group
from pipeline.errors import EvidentError
from pipeline.runtime.redact import Redactor


@click.group()
@click.option("--config", "config_path", type=click.Path(path_type=Path), default=None,
              help="TOML settings file (else $EVIDENT_CONFIG).")
@click.option("-v", "--verbose", is_flag=True, help="Debug logging.")
@click.pass_context
def main(ctx: click.Context, config_path: Path | None, verbose: bool) -> None:
    """evident: answers from your Confluence wiki, with sources and causal explanations."""
    try:
        settings = Settings.load(toml_path=config_path)
    except EvidentError as exc:
        click.echo(Redactor()(f"error: {exc}"), err=True)
        sys.exit(2)
    from evident.logging_setup import setup_logging

    secrets = Redactor.from_settings(settings)
    setup_logging(
        settings.core.log_level,
        json_lines=settings.core.log_format == "json",
        verbose=verbose,
        redactor=secrets,
    )
    ctx.obj = {"settings": settings, "redactor": secrets}


@main.group()
def config() -> None:
    """Show the effective configuration."""


@config.command("show")
@click.pass_context
def config_show(ctx: click.Context) -> None:
    """Print the effective configuration with secrets masked."""
    click.echo(json.dumps(ctx.obj["settings"].masked(), indent=2, default=str))


for command in (
    ingest,
    search,
    index_group,
    ask,
    chat,
    explain,
    demo,
    eval_group,
    sync,
    serve,
    backup,
    restore,
    teams_group,
):
    main.add_command(command)
