"""The ingest area: how pages become evidence, and each page's bounds (docs/ingest.md)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BeforeValidator, field_validator

from pipeline.ingest.contextualize import CONTEXT_ITEMS
from pipeline.runtime.config import Area, CommaList, Lower, setting


def _dense_items(value: object) -> object:
    """'none' (or nothing) -> raw text (``()``), 'same' -> None (the indexed context items)."""
    items = value.split(",") if isinstance(value, str) else value
    if isinstance(items, list | tuple):
        items = tuple(str(i).strip() for i in items if str(i).strip())
        if items in (("none",), ()):
            return ()
        if items == ("same",):
            return None
    return items


class IngestSettings(Area):
    title = "Evidence and ingest bounds"

    context_items: CommaList = setting(("title", "heading", "before", "after"), "EVIDENT_CONTEXT_ITEMS",
                                       "Context joined to each evidence for indexing (comma list of "
                                       + ", ".join(CONTEXT_ITEMS) + ").")
    dense_context_items: Annotated[tuple[str, ...] | None, BeforeValidator(_dense_items)] = setting(
        ("title", "heading"),
        "EVIDENT_DENSE_CONTEXT_ITEMS",
        "Context for the dense vector only (comma list; 'none' "
        "for raw text; 'same' = EVIDENT_CONTEXT_ITEMS). Measured best: title,heading (neighbours push the "
        "evidence "
        "out of the model's 128-token window).",
    )
    context_item_max_chars: int = setting(300, "EVIDENT_CONTEXT_ITEM_MAX_CHARS",
                                          "Bound on each context item's length.", ge=2)
    table_indexing: Annotated[Literal["rows", "tables", "both"], Lower] = setting(
        "both", "EVIDENT_TABLE_INDEXING", "Index tables as rows | tables | both.")
    linearization: Annotated[Literal["verbalized", "markdown", "plain"], Lower] = setting(
        "verbalized",
        "EVIDENT_LINEARIZATION",
        "Table rows as verbalized ('Row 2 in Table 1: A is x, and B is y') | markdown | plain.",
    )
    max_page_bytes: int = setting(4 * 2**20, "EVIDENT_MAX_PAGE_BYTES",
                                  "Largest page body indexed (bytes of storage format).", ge=1024)
    page_timeout_s: float = setting(
        30.0, "EVIDENT_PAGE_TIMEOUT_S", "Time one page may take to parse and split.", ge=0.1
    )
    max_evidence_chars: int = setting(
        64_000,
        "EVIDENT_MAX_EVIDENCE_CHARS",
        "Longest evidence text; longer tables and lists are split, longer rows cut.",
        ge=100,
    )
    max_evidence_per_page: int = setting(
        2_000,
        "EVIDENT_MAX_EVIDENCE_PER_PAGE",
        "Evidence per page; table rows beyond it are left to their tables' evidence.",
        ge=1,
    )
    max_table_cells: int = setting(
        500_000,
        "EVIDENT_MAX_TABLE_CELLS",
        "Cells of one table after span expansion (extra columns are joined into the last).",
        ge=1,
    )
    min_text_coverage: float = setting(
        0.9,
        "EVIDENT_MIN_TEXT_COVERAGE",
        "A page whose parse keeps less of its visible text is reported as partial.",
        ge=0,
        le=1,
    )

    page_process: Literal["auto", "yes", "no"] = setting(
        "auto",
        "EVIDENT_PAGE_PROCESS",
        "Prepare pages (parse, BM25-encode, count their words) in a worker process at a lower CPU "
        "priority: auto (in serve: yes) | yes | no. In serve's own process that work holds the GIL that "
        "questions being answered need.",
    )
    page_process_nice: int = setting(
        10, "EVIDENT_PAGE_PROCESS_NICE",
        "How much lower the page worker's CPU priority is (a nice increment).", ge=0, le=19,
    )

    @field_validator("context_items", "dense_context_items")
    @classmethod
    def _known_items(cls, items: tuple[str, ...] | None) -> tuple[str, ...] | None:
        unknown = [c for c in items or () if c not in CONTEXT_ITEMS]
        if unknown:
            raise ValueError(f"unknown item(s) {', '.join(unknown)}; choose from {', '.join(CONTEXT_ITEMS)}")
        return items
