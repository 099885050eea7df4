"""What every `evident` command shares: one-line errors with exit codes, settings with overrides, options."""

from __future__ import annotations

import asyncio
import functools
import sys
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any, TypeVar

import click

from evident.settings import Settings
from pipeline.errors import EvidentError
from pipeline.runtime.redact import Redactor

T = TypeVar("T")

MAX_ERROR_CHARS = 600


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def redactor() -> Redactor:
    """The redactor of the running command (built from its settings in ``main``)."""
    ctx = click.get_current_context(silent=True)
    found = ctx.find_object(dict) if ctx is not None else None
    return found.get("redactor") or Redactor() if found else Redactor()


def echo_error(line: str) -> None:
    """One line on stderr, credentials masked (a quoted response body can span lines and pages)."""
    text = " ".join(redactor()(line).split())
    click.echo(text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 1] + "…", err=True)


def cli_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn evident's errors into one clear line and exit code 2."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except EvidentError as exc:
            echo_error(f"error: {exc}")
            sys.exit(2)
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            sys.exit(130)

    return wrapper


def load_settings(ctx: click.Context, **overrides: Any) -> Settings:
    """The settings read at start-up, with the command's own options (those given) applied."""
    base: Settings = ctx.obj["settings"]
    clean = {k: v for k, v in overrides.items() if v is not None}
    return base.replace(**clean) if clean else base


def echo_page_problems(failed: Sequence[tuple[str, str]], partial: Sequence[tuple[str, str]],
                       warnings: Sequence[tuple[str, str]]) -> None:
    """One stderr line per page problem: ``failed:`` (not indexed), ``partial:`` (text lost), ``warning:``."""
    for label, rows in (("failed", failed), ("partial", partial), ("warning", warnings)):
        for where, reason in rows:
            echo_error(f"{label}: {where}: {reason}")


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"  # pragma: no cover - loop always returns


index_dir_option = click.option(
    "--index-dir", type=click.Path(path_type=Path), default=None,
    help="Embedded index directory (default DATA_DIR/index).",
)
