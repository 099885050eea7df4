"""Structured logs carry the turn reference and never a token."""

from __future__ import annotations

import json
import logging

from evident.logging_setup import JsonFormatter
from pipeline.runtime.logcontext import TurnRefFilter, new_turn_ref


def _format(msg: str, *args: object) -> dict[str, object]:
    rec = logging.LogRecord("evident.test", logging.INFO, __file__, 1, msg, args, None)
    TurnRefFilter().filter(rec)
    return json.loads(JsonFormatter().format(rec))


def test_json_line_has_turn_ref() -> None:
    ref = new_turn_ref()
    line = _format("answered in %d ms", 12)
    assert line["msg"] == "answered in 12 ms"
    assert line["turn_ref"] == ref
    assert line["level"] == "INFO"


def test_tokens_are_redacted() -> None:
    line = _format("calling with %s and Authorization: Bearer abcdefghijkl123", "xoxb-1234567890-abcdef")
    assert "xoxb-1234567890" not in str(line["msg"])
    assert "abcdefghijkl123" not in str(line["msg"])
    assert "[redacted]" in str(line["msg"])
