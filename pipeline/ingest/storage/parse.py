"""One page's storage format -> elements, with how much of its visible text they kept.

1. ``repair.sanitize`` + ``repair.repair`` (and ``repair.limit_depth`` past ``MARKUP_DEPTH`` levels);
2. strict XML (``tree.strict_tree``); a page that is not well-formed goes through the recovering HTML
   parser (``tree.html_tree``) instead, so a local defect costs a fragment, not the rest of the page;
3. ``walker.walk_tree`` within the page's bounds (time, depth, table budget);
4. coverage: the share of the words an HTML parse of the same body shows that the elements kept (each
   word as often as it appears there, weighted by its length; copies made by spans add nothing). A strict
   parse below ``min_coverage`` is retried in HTML mode; the better one is kept, and a page still below
   it is flagged (``ParseResult.low_coverage``) for the caller to report instead of silently indexing
   a stub.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from pipeline.ingest.storage.clock import now
from pipeline.ingest.storage.inline import render_text
from pipeline.ingest.storage.repair import limit_depth, max_depth, repair, sanitize
from pipeline.ingest.storage.tables import TableBudget
from pipeline.ingest.storage.tree import html_tree, strict_tree, visible_words, word_counts
from pipeline.ingest.storage.walker import WalkContext, walk_tree
from pipeline.types import Element, Table

MARKUP_DEPTH = 1024  # libxml2 gives up at 2,048 levels and loses the rest of the page


@dataclass(frozen=True)
class ParseLimits:
    """Bounds on parsing one page (documented in docs/ingest.md; settings in docs/configuration.md)."""

    # From the ingest settings (EVIDENT_PAGE_TIMEOUT_S, EVIDENT_MAX_TABLE_CELLS, EVIDENT_MIN_TEXT_COVERAGE).
    timeout_s: float
    max_table_cells: int
    min_coverage: float
    # Fixed bounds of the parser itself.
    max_depth: int = 200  # deeper markup is kept as flat text
    max_table_columns: int = 128
    max_span_chars: int = 1_000_000  # text a page's merged cells may duplicate


@dataclass
class ParseResult:
    elements: list[Element]
    mode: str  # "xml" (well-formed) | "html" (recovered)
    coverage: float  # share of the visible word characters kept, capped at 1
    notes: list[str] = field(default_factory=list)  # what was recovered or bounded, for the report

    def low_coverage(self, limits: ParseLimits) -> bool:
        return self.coverage < limits.min_coverage


def parse_page(xhtml: str, *, limits: ParseLimits, page_id: str = "") -> ParseResult:
    """Parse one ``body.storage.value``; raises ``ParseTimeoutError`` past ``limits.timeout_s``."""
    if not xhtml or not xhtml.strip():
        return ParseResult([], "xml", 1.0)
    notes: list[str] = []
    text = repair(sanitize(xhtml))
    if max_depth(text) > MARKUP_DEPTH:
        text = limit_depth(text, MARKUP_DEPTH)
        notes.append(f"markup nested deeper than {MARKUP_DEPTH} levels was flattened (text kept)")
    ctx = _context(page_id, limits)
    reference = visible_words(text)
    tree = strict_tree(text)
    if tree is None:
        mode = "html"
        elements = walk_tree(html_tree(text), ctx)
        notes.append("storage format is not well-formed XML; recovered with an HTML parser")
    else:
        mode = "xml"
        elements = walk_tree(tree, ctx)
    coverage = _coverage(elements, reference)
    if mode == "xml" and coverage < limits.min_coverage:
        retry_ctx = _context(page_id, limits, deadline=ctx.deadline)
        retry = walk_tree(html_tree(text), retry_ctx)
        if (retried := _coverage(retry, reference)) > coverage:
            elements, coverage, mode, ctx = retry, retried, "html", retry_ctx
    notes.extend(ctx.tables.notes)
    return ParseResult(elements, mode, coverage, notes)


def _context(page_id: str, limits: ParseLimits, deadline: float | None = None) -> WalkContext:
    return WalkContext(
        page_id=page_id, max_depth=limits.max_depth, timeout_s=limits.timeout_s,
        deadline=deadline if deadline is not None else now() + limits.timeout_s,
        tables=TableBudget(max_columns=limits.max_table_columns, max_cells=limits.max_table_cells,
                           max_span_chars=limits.max_span_chars),
    )


def _coverage(elements: list[Element], reference: Counter[str]) -> float:
    total = sum(len(w) * n for w, n in reference.items())
    if total <= 0:
        return 1.0
    kept: Counter[str] = Counter()
    for e in elements:
        if isinstance(e, Table):
            kept.update(word_counts(" ".join((e.caption, *e.headers, *(v for row in e.rows for v in row)))))
        else:
            kept.update(word_counts(render_text([e])))
    return sum(len(w) * min(n, kept[w]) for w, n in reference.items()) / total
