"""Shared fixtures. Real components only: temp dirs, real SQLite, local servers on 127.0.0.1."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
CONFQ = REPO.parent / "shared" / "confquestions"


@pytest.fixture(scope="session")
def confq_dir() -> Path:
    """The ConfQuestions benchmark folder, read in place (never copied: CC BY-NC-ND)."""
    if not (CONFQ / "documents").is_dir():
        pytest.skip("../shared/confquestions not present")
    return CONFQ
