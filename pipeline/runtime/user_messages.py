"""Short, human messages for failures, shared by every front end (CLI, Slack).

The user always hears back in one line; the detail goes to the logs only.
"""

from __future__ import annotations

from pipeline.errors import (
    AuthError,
    EmbeddingError,
    IndexError_,
    InputError,
    NotFoundError,
    RateLimitedError,
    RemoteError,
    StoreError,
)

GENERIC = "Something went wrong while answering, sorry. Please try again; the details are in the bot's logs."


def user_message(exc: BaseException) -> str:
    """Map an exception to a one-line message that is safe to show to the person who asked."""
    if isinstance(exc, RateLimitedError):
        return "The language model is busy right now, please try again in a minute."
    if isinstance(exc, AuthError):
        return "I couldn't log in to the language model; an admin needs to check its API key."
    if isinstance(exc, NotFoundError):
        return "The configured language model was not found; an admin needs to check the model name."
    if isinstance(exc, RemoteError):
        return "I couldn't reach the language model, please try again."
    if isinstance(exc, IndexError_ | EmbeddingError):
        return "The wiki index isn't available right now, please try again later."
    if isinstance(exc, StoreError):
        return "I couldn't access my conversation store, please try again."
    if isinstance(exc, InputError):
        return str(exc)
    if isinstance(exc, TimeoutError):
        return "That took too long, please try again."
    return GENERIC
