"""Table-row linearizations for the paper's ablation; verbalized stays the default."""

from __future__ import annotations

import pytest
from helpers import build_evidence

from pipeline.errors import ConfigError
from pipeline.ingest.evidence import linearize_row
from pipeline.types import Page, Table

HEADERS = ("Member", "Task")
ROW = ("Alice", "Prepare the evaluation todo list")


def test_styles() -> None:
    assert linearize_row(HEADERS, ROW, row_number=2, table_number=1) == (
        "Row 2 in Table 1: Member is Alice, and Task is Prepare the evaluation todo list"
    )
    assert linearize_row(HEADERS, ROW, row_number=2, table_number=1, style="markdown") == (
        "| Member | Task |\n|---|---|\n| Alice | Prepare the evaluation todo list |"
    )
    assert linearize_row(HEADERS, ROW, row_number=2, table_number=1, style="plain") == (
        "Alice Prepare the evaluation todo list"
    )
    assert linearize_row(HEADERS, ("", " "), row_number=1, table_number=1, style="plain") == ""


def test_markdown_table_evidence_has_header_once() -> None:
    page = Page(id="p", title="T", url="u", space="S", body="")
    table = Table(headers=HEADERS, rows=(ROW, ("Bob", "Book the room")))
    ev = build_evidence(page, [table], linearization="markdown")
    whole = next(e for e in ev if e.kind == "table")
    assert (
        whole.text
        == "| Member | Task |\n|---|---|\n| Alice | Prepare the evaluation todo list |\n"
           "| Bob | Book the room |"
    )
    rows = [e for e in ev if e.kind == "row"]
    assert rows[1].text == "| Member | Task |\n|---|---|\n| Bob | Book the room |"


def test_unknown_linearization() -> None:
    with pytest.raises(ConfigError, match="linearization"):
        build_evidence(Page(id="p", title="T", url="u", space="S", body=""), [], linearization="csv")
