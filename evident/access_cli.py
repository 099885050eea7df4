"""`--as EMAIL` for `evident ask/chat/explain/search`: answer as a person would be answered (per-user access).

Without ``--as`` the commands see every indexed evidence: they are the operator's tools, run where the index
and the store are anyway.
"""

from __future__ import annotations

import click

from evident.settings import Settings
from pipeline.access.people import Directory, People
from pipeline.access.scope import EVERYTHING, AccessScope
from pipeline.errors import ConfigError

as_option = click.option(
    "--as", "as_email", default=None, metavar="EMAIL",
    help="Answer from what this person may read in Confluence (EVIDENT_ACCESS=per-user).",
)


async def scope_for(settings: Settings, directory: Directory, as_email: str | None) -> AccessScope:
    """The scope of a command run ``--as`` a person (printed: how they were mapped), else every evidence."""
    if not as_email:
        return EVERYTHING
    if settings.access.mode != "per-user":
        raise ConfigError("--as needs EVIDENT_ACCESS=per-user (in space mode everyone is answered alike)")
    identity = await People(directory, settings.access).identity(as_email)
    click.echo(click.style(f"(as {as_email}: {identity.how}"
                           + (f", account {identity.account})" if identity.account else ")"), dim=True))
    return AccessScope.for_readers([identity.reader], None, as_email)
