"""A per-turn correlation id for logs, carried by a contextvar so every stage's log lines share it."""

from __future__ import annotations

import contextvars
import logging
import re
import uuid

turn_ref: contextvars.ContextVar[str] = contextvars.ContextVar("evident_turn_ref", default="")

# Token shapes that must never reach a log line, whatever a library prints.
_SECRET = re.compile(
    r"(xox[abprs]-[A-Za-z0-9-]{6,}|xapp-[A-Za-z0-9-]{6,}|sk-[A-Za-z0-9_-]{12,}|"
    r"(?i:bearer)\s+[A-Za-z0-9._~+/=-]{8,}|(?i:basic)\s+[A-Za-z0-9+/=]{8,})"
)


def new_turn_ref() -> str:
    ref = uuid.uuid4().hex[:12]
    turn_ref.set(ref)
    return ref


def redact(text: str) -> str:
    return _SECRET.sub("[redacted]", text)


class TurnRefFilter(logging.Filter):
    """Adds ``record.turn_ref`` and scrubs token-shaped strings from the message."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.turn_ref = turn_ref.get()
        if isinstance(record.msg, str):
            msg = record.getMessage()
            clean = redact(msg)
            if clean != msg:
                record.msg, record.args = clean, ()
        return True
