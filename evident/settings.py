"""The application's settings, read once by the CLI: every area of every package, composed."""

from __future__ import annotations

from bot.core.settings import ChatSettings
from bot.slack.settings import SlackSettings
from bot.teams.settings import TeamsSettings
from connectors.settings import ConnectorSettings
from pipeline.runtime.config import Area, setting


class ServeSettings(Area):
    title = "evident serve"

    http_port: int = setting(3000, "EVIDENT_HTTP_PORT", "Port of the health and metrics endpoints (/healthz, "
                             "/livez, /readyz, /metrics) and of Slack's HTTP transport.", ge=0, le=65535)
    sync_interval_s: int = setting(
        900, "EVIDENT_SYNC_INTERVAL_S", "Background sync period in `evident serve`.", ge=10
    )
    loop_watch_ms: int = setting(
        100, "EVIDENT_LOOP_WATCH_MS", "Log a warning, with where it was, whenever serve's event loop is "
        "blocked longer than this. 0: off.", ge=0
    )
    switch_interval_ms: float = setting(
        1.0, "EVIDENT_SWITCH_INTERVAL_MS", "How long another thread of serve (a sync parsing pages) may hold "
        "Python's GIL before the event loop gets it back (Python's default is 5).", ge=0.1, le=100
    )


class Settings(ConnectorSettings):
    chat: ChatSettings
    slack: SlackSettings
    teams: TeamsSettings
    serve: ServeSettings
