"""What of a Slack Web API failure may be logged."""

from __future__ import annotations

from slack_sdk.errors import SlackApiError, SlackClientError


def slack_error(exc: SlackClientError) -> str:
    """The Slack error code only: response bodies can echo request data, never log them whole."""
    if isinstance(exc, SlackApiError):
        data = exc.response.data
        if isinstance(data, dict):
            return str(data.get("error", "unknown_error"))
        return f"HTTP {exc.response.status_code}"
    return type(exc).__name__
