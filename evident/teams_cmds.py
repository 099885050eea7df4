"""`evident teams package`: the Teams app package to upload."""

from __future__ import annotations

from pathlib import Path

import click

from evident.common import cli_errors, load_settings


@click.group("teams")
def teams_group() -> None:
    """Microsoft Teams: the app package."""


@teams_group.command("package")
@click.option("--out", type=click.Path(path_type=Path), default=Path("evident-teams.zip"), show_default=True,
              help="Where to write the zip.")
@click.option("--app-id", default=None, help="The bot's Microsoft App ID (default TEAMS_APP_ID).")
@click.pass_context
@cli_errors
def teams_package(ctx: click.Context, out: Path, app_id: str | None) -> None:
    """Zip manifest.json (with the bot's app id) and the icons for upload to Teams."""
    from bot.teams.package import build_package

    settings = load_settings(ctx)
    path = build_package(app_id or settings.teams.app_id or "", out)
    click.echo(
        f"wrote {path}: upload it in Teams (Apps → Manage your apps → Upload an app) or the admin center"
    )
