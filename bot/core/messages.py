"""Short, human messages for failures: the user always hears back; details go to the logs only."""

from __future__ import annotations

from pipeline.runtime.user_messages import GENERIC, user_message

__all__ = ["EXPLAIN_FAILED", "GENERIC", "NOTHING_TO_EXPLAIN", "RESTARTING", "rate_limited_message", "user_message"]

RESTARTING = "I'm restarting and couldn't finish this answer. Please ask again in a minute."
EXPLAIN_FAILED = "I couldn't work out why I gave that answer, sorry. Please try again later."
NOTHING_TO_EXPLAIN = ("There is nothing to explain: I didn't find an answer to that question in the wiki, "
                      "so no source produced it.")


def rate_limited_message(retry_after_s: int) -> str:
    return (f"You're asking faster than I can keep up. Please wait about {max(1, retry_after_s)} s "
            "and try again.")
