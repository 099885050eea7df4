"""The Slack area: the app's tokens, its transport and what reactions and admins do."""

from __future__ import annotations

from typing import Annotated, Literal

from pipeline.runtime.config import Area, CommaList, HttpUrl, Lower, SecretStr, setting


class SlackSettings(Area):
    title = "Slack"

    bot_token: SecretStr = setting(
        SecretStr(""), "SLACK_BOT_TOKEN", "Bot token (xoxb-...); set it to serve Slack."
    )
    app_token: SecretStr = setting(
        SecretStr(""), "SLACK_APP_TOKEN", "App-level token (xapp-...) for Socket Mode."
    )
    signing_secret: SecretStr = setting(SecretStr(""), "SLACK_SIGNING_SECRET",
                                        "Signing secret for the HTTP transport.")
    transport: Annotated[Literal["socket", "http"], Lower] = setting("socket", "EVIDENT_SLACK_TRANSPORT",
                                                                     "socket | http.")
    api_url: HttpUrl = setting(
        None,
        "EVIDENT_SLACK_API_URL",
        "Slack Web API base URL (GovSlack, an egress proxy); default https://slack.com/api/.",
    )
    explain_emojis: CommaList = setting(("explain", "mag"), "EVIDENT_EXPLAIN_EMOJIS",
                                        "Reactions that request an explanation.")
    ask_ephemeral: bool = setting(
        False, "EVIDENT_ASK_EPHEMERAL", "Answer /ask ephemerally instead of in channel."
    )
    stream: bool = setting(
        True,
        "EVIDENT_SLACK_STREAM",
        "Stream answers into threads (task cards, then the text as it is written); off, or where Slack "
        "refuses: a placeholder or the assistant status, then the whole answer.",
    )
    ignore_bots: bool = setting(True, "EVIDENT_IGNORE_BOTS", "Ignore messages from other bots.")
    admin_users: CommaList = setting((), "EVIDENT_ADMIN_USERS",
                                     "Slack user ids who see the feedback summary in evident's App Home.")
