"""Short, human messages for failures: the user always hears back; details go to the logs only."""

from __future__ import annotations

from pipeline.runtime.user_messages import GENERIC, user_message
from pipeline.types import Answer

__all__ = [
    "CERTAINTY_NOTE",
    "EXPLAIN_FAILED",
    "GENERIC",
    "NOTHING_TO_EXPLAIN",
    "RESTARTING",
    "certainty_note",
    "rate_limited_message",
    "user_message",
]

RESTARTING = "I'm restarting and couldn't finish this answer. Please ask again in a minute."
EXPLAIN_FAILED = "I couldn't work out why I gave that answer, sorry. Please try again later."
NOTHING_TO_EXPLAIN = ("There is nothing to explain: I didn't find an answer to that question in the wiki, "
                      "so no source produced it.")


def rate_limited_message(retry_after_s: int) -> str:
    return (f"You're asking faster than I can keep up. Please wait about {max(1, retry_after_s)} s "
            "and try again.")


CERTAINTY_NOTE = ("Low confidence: the wiki's keyword and meaning searches disagree on where the answer is, "
                  "so please check the sources.")


def certainty_note(answer: Answer) -> str | None:
    """The note under an answer whose evidence retrieval was unsure of (``pipeline.answer.confidence``);
    never under a refusal."""
    return (
        CERTAINTY_NOTE
        if answer.confidence == "low" and not answer.out_of_scope and answer.text.strip()
        else None
    )
