"""`evident serve`: the command; the lifecycle lives in ``evident.serve``."""

from __future__ import annotations

import click

from evident.common import cli_errors, load_settings, run


@click.command()
@click.pass_context
@cli_errors
def serve(ctx: click.Context) -> None:
    """Run the Slack and/or Teams bot (whichever is configured) with periodic Confluence sync."""
    from evident.serve import serve_forever

    run(serve_forever(load_settings(ctx)))
