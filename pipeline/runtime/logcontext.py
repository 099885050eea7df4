"""A per-turn correlation id for logs, carried by a contextvar so every stage's log lines share it."""

from __future__ import annotations

import contextvars
import logging
import uuid

from pipeline.runtime.redact import Redactor, redact

turn_ref: contextvars.ContextVar[str] = contextvars.ContextVar("evident_turn_ref", default="")

__all__ = ["TurnRefFilter", "new_turn_ref", "redact", "turn_ref"]


def new_turn_ref() -> str:
    ref = uuid.uuid4().hex[:12]
    turn_ref.set(ref)
    return ref


class TurnRefFilter(logging.Filter):
    """Adds ``record.turn_ref`` and scrubs credentials from the message and any traceback."""

    def __init__(self, redactor: Redactor | None = None) -> None:
        super().__init__()
        self.redactor = redactor or Redactor()

    def filter(self, record: logging.LogRecord) -> bool:
        record.turn_ref = turn_ref.get()
        msg = record.getMessage()
        clean = self.redactor(msg)
        if clean != msg or record.args:
            record.msg, record.args = clean, ()
        if record.exc_info and not record.exc_text:
            record.exc_text = self.redactor(logging.Formatter().formatException(record.exc_info))
        elif record.exc_text:
            record.exc_text = self.redactor(record.exc_text)
        return True
