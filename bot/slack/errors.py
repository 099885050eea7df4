"""What of a Slack Web API failure may be logged, and which failures a Slack call can end in."""

from __future__ import annotations

import aiohttp
from slack_sdk.errors import SlackApiError, SlackClientError

# a Web API call fails with Slack's error, or the network's (slack_sdk does not wrap aiohttp's errors)
SLACK_FAILURES = (SlackClientError, aiohttp.ClientError, TimeoutError)
_TRANSIENT = {"ratelimited", "rate_limited", "internal_error", "fatal_error", "service_unavailable",
              "request_timeout"}


def slack_error(exc: BaseException) -> str:
    """The Slack error code only: response bodies can echo request data, never log them whole."""
    if isinstance(exc, SlackApiError):
        data = exc.response.data
        if isinstance(data, dict):
            return str(data.get("error", "unknown_error"))
        return f"HTTP {exc.response.status_code}"
    return type(exc).__name__


def transient(exc: BaseException) -> bool:
    """A rate limit, Slack's 5xx or a network failure: worth sending again later."""
    if not isinstance(exc, SlackApiError):
        return True  # the network's, or the client's own timeout
    code = slack_error(exc)
    return code in _TRANSIENT or exc.response.status_code in (429, 500, 502, 503, 504)


def retry_after_s(exc: BaseException, default: float = 1.0, cap: float = 30.0) -> float:
    """Slack's ``Retry-After`` (seconds, capped), or ``default``."""
    if isinstance(exc, SlackApiError):
        value = exc.response.headers.get("Retry-After") or exc.response.headers.get("retry-after")
        try:
            return min(max(float(value), 0.0), cap) if value is not None else default
        except ValueError:
            return default
    return default
