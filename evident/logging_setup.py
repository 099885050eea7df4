"""Logging for the CLI and the service: human text or structured JSON lines, never secrets."""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import TextIO

from pipeline.runtime.logcontext import TurnRefFilter
from pipeline.runtime.redact import Redactor


class JsonFormatter(logging.Formatter):
    def __init__(self, redactor: Redactor | None = None) -> None:
        super().__init__()
        self.redactor = redactor or Redactor()

    def format(self, record: logging.LogRecord) -> str:
        out = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        ref = getattr(record, "turn_ref", "")
        if ref:
            out["turn_ref"] = ref
        if record.exc_info:
            out["exc"] = record.exc_text or self.redactor(self.formatException(record.exc_info))
        return json.dumps(out, ensure_ascii=False)


class BarSafeStream:
    """A stream for log lines that never lands on a progress bar's line: each line goes through
    ``tqdm.write``, which clears the bars on the same stream, prints, and draws them again."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def write(self, text: str) -> None:
        if text:
            from tqdm import tqdm

            tqdm.write(text, file=self.stream, end="")

    def flush(self) -> None:
        self.stream.flush()


def setup_logging(
    level: str, *, json_lines: bool, verbose: bool = False, redactor: Redactor | None = None
) -> None:
    handler = logging.StreamHandler(BarSafeStream(sys.stderr))
    handler.addFilter(TurnRefFilter(redactor))
    if json_lines:
        handler.setFormatter(JsonFormatter(redactor))
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.DEBUG if verbose else getattr(logging, level.upper(), logging.INFO))
    for noisy in ("httpx", "httpcore", "openai", "urllib3", "slack_bolt", "slack_sdk"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
