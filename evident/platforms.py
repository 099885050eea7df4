"""The chat platforms `evident serve` can run: one registration each (a new platform is its package plus a
line here). A platform is served when its settings say so (Slack: ``SLACK_BOT_TOKEN``, Teams:
``TEAMS_APP_ID``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from bot.core.access import AccessPolicy
from bot.core.contracts import EngineLike
from bot.core.platform import Platform
from evident.settings import Settings
from pipeline.errors import ConfigError
from pipeline.runtime.metrics import Metrics


@dataclass(frozen=True)
class Registration:
    name: str
    configured: Callable[[Settings], bool]  # its settings ask for it
    check: Callable[[Settings], None]  # complete settings (ConfigError), checked before any model loads
    build: Callable[[Settings, EngineLike, Metrics], Platform]


def access_policy(settings: Settings, engine: EngineLike) -> AccessPolicy:
    """The one access policy of a platform: the place's spaces, and in per-user mode the people directory the
    permission sync keeps in the store."""
    return AccessPolicy.from_settings(settings.access, settings.chat, engine.store)


def _slack(settings: Settings, engine: EngineLike, metrics: Metrics) -> Platform:
    from bot.slack.platform import SlackPlatform

    return SlackPlatform(
        settings.slack, settings.chat, engine, access_policy(settings, engine), metrics=metrics
    )


def _check_slack(settings: Settings) -> None:
    from bot.slack.transports import check_tokens

    check_tokens(settings.slack)


def _teams(settings: Settings, engine: EngineLike, metrics: Metrics) -> Platform:
    from bot.teams.app import TeamsPlatform

    return TeamsPlatform(
        settings.teams, settings.chat, engine, access_policy(settings, engine), metrics=metrics
    )


def _check_teams(settings: Settings) -> None:
    from bot.teams.app import check_teams_settings

    check_teams_settings(settings.teams)


REGISTRY: tuple[Registration, ...] = (
    Registration("slack", lambda s: bool(s.slack.bot_token.get_secret_value()), _check_slack, _slack),
    Registration("teams", lambda s: bool(s.teams.app_id), _check_teams, _teams),
)


def configured(settings: Settings) -> tuple[Registration, ...]:
    """The platforms the settings configure (each checked for completeness); ConfigError when there is
    none."""
    chosen = tuple(r for r in REGISTRY if r.configured(settings))
    if not chosen:
        raise ConfigError("nothing to serve: set SLACK_BOT_TOKEN (Slack) and/or TEAMS_APP_ID (Teams)")
    for r in chosen:
        r.check(settings)
    return chosen
