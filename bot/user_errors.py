"""Short, human messages for failures: the user always hears back; details go to the logs only."""

from __future__ import annotations

from pipeline.errors import (
    AuthError,
    EmbeddingError,
    IndexError_,
    InputError,
    RateLimitedError,
    RemoteError,
    StoreError,
)

GENERIC = "Something went wrong while answering, sorry. Please try again; the details are in the bot's logs."
EXPLAIN_FAILED = "I couldn't work out why I gave that answer, sorry. Please try again later."


def user_message(exc: BaseException) -> str:
    """Map an exception from the engine to a one-line message that is safe to show in Slack."""
    if isinstance(exc, RateLimitedError):
        return "The language model is busy right now, please try again in a minute."
    if isinstance(exc, AuthError):
        return "I couldn't log in to the language model; an admin needs to check its API key."
    if isinstance(exc, RemoteError):
        return "I couldn't reach the language model, please try again."
    if isinstance(exc, IndexError_ | EmbeddingError):
        return "The wiki index isn't available right now, please try again later."
    if isinstance(exc, StoreError):
        return "I couldn't access my conversation store, please try again."
    if isinstance(exc, InputError):
        return f"I couldn't use that question: {exc}"
    if isinstance(exc, TimeoutError):
        return "That took too long, please try again."
    return GENERIC


def rate_limited_message(retry_after_s: int) -> str:
    return (f"You're asking faster than I can keep up. Please wait about {max(1, retry_after_s)} s "
            "and try again.")
