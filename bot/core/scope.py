"""Which Confluence spaces a question may be answered from: the asking channel's mapping, else the default.

``EVIDENT_CHANNEL_SPACES`` maps channel ids (Slack or Teams) to space keys; DMs, assistant threads and
unmapped channels get ``EVIDENT_DEFAULT_SPACES``: ``*`` (every indexed space), ``none`` (nothing: evident
asks to be connected) or a list of space keys.
"""

from __future__ import annotations

from collections.abc import Mapping

EVERY_SPACE = None  # no space filter
NO_SPACE: tuple[str, ...] = ()  # answer nothing here

NOT_CONNECTED = ("This conversation isn't connected to any wiki space yet. Ask an admin to map it "
                 "(`EVIDENT_CHANNEL_SPACES`) or to set `EVIDENT_DEFAULT_SPACES`.")


class Scope:
    def __init__(
        self, channel_spaces: Mapping[str, tuple[str, ...]], default_spaces: tuple[str, ...]
    ) -> None:
        self.channel_spaces = dict(channel_spaces)
        special = {x.strip().lower() for x in default_spaces}
        if not default_spaces or special == {"*"}:
            self.default: tuple[str, ...] | None = EVERY_SPACE
        elif special == {"none"}:
            self.default = NO_SPACE
        else:
            self.default = tuple(default_spaces)

    def __call__(self, channel: str, team: str = "") -> tuple[str, ...] | None:
        """Space keys for a question asked in ``channel`` (None: every space; empty: none). A Teams channel
        that is not mapped itself takes its team's mapping, where the team id is mapped."""
        mapped = self.channel_spaces.get(channel) or (self.channel_spaces.get(team) if team else None)
        return tuple(mapped) if mapped else self.default
