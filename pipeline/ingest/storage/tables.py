"""HTML tables -> ``Table``: row/colspan expansion within bounds, header rows, unique header names.

Spans are expanded so every row has one value per column (a merged cell applies to each column it
covers). Expansion duplicates text, so it is bounded: a span that would push the page's duplicated
text past ``max_span_chars`` is placed at its origin only (nothing is lost, the value is there once).
The grid is bounded too: a table keeps at most ``min(max_columns, max_cells // rows)`` columns, and
cells beyond the last one are joined into it rather than dropped.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

from lxml import etree

from pipeline.types import Element, Table

_MAX_SPAN = 1000  # clamp absurd row/colspan values before any budget applies
_GENERIC_HEADER = re.compile(r"Column \d+")


@dataclass
class TableBudget:
    """What one page may spend on tables; shared by every table of the page."""

    max_columns: int = 128
    max_cells: int = 500_000
    max_span_chars: int = 1_000_000
    span_chars: int = 0
    notes: list[str] = field(default_factory=list)


def span(value: str | None) -> int:
    try:
        n = int((value or "1").strip())
    except ValueError:
        return 1
    return max(1, min(n, _MAX_SPAN))


def build_table(
    rows: list[etree._Element],
    caption: str,
    cell_elements: Callable[[etree._Element], list[Element]],
    render: Callable[[list[Element]], str],
    budget: TableBudget,
    number: int,
) -> tuple[Table | None, list[Table]]:
    """The table of ``rows`` (``tr`` elements) and the tables nested in its cells."""
    nested: list[Table] = []
    grid: dict[tuple[int, int], tuple[str, bool]] = {}
    n_rows = len(rows)
    max_cols = max(1, min(budget.max_columns, budget.max_cells // max(1, n_rows)))
    width = 0
    merged = clipped = False
    for r, tr in enumerate(rows):
        c = 0
        for cell in tr:
            tag = cell.tag.lower() if isinstance(cell.tag, str) else ""
            if tag not in ("td", "th"):
                continue
            while (r, c) in grid:
                c += 1
            elements = cell_elements(cell)
            nested.extend(e for e in elements if isinstance(e, Table))
            value = render(elements)
            if c >= max_cols:  # beyond the last column: joined into it, not dropped
                last = max_cols - 1
                old, th = grid.get((r, last), ("", False))
                grid[(r, last)] = (f"{old} {value}".strip(), th or tag == "th")
                merged = True
                continue
            advance, was_clipped = _place(
                grid, cell, (r, c), (value, tag == "th"), (n_rows, max_cols), budget
            )
            clipped = clipped or was_clipped
            c += advance
            width = max(width, c)
    if merged:
        budget.notes.append(
            f"table {number} has more than {max_cols} columns; the rest were joined into the last"
        )
    if clipped:
        budget.notes.append(f"table {number}: merged cells were not expanded (page span budget)")
    return make_table(grid, n_rows, width, caption), nested


def _place(grid: dict[tuple[int, int], tuple[str, bool]], cell: etree._Element, at: tuple[int, int],
           value: tuple[str, bool], bounds: tuple[int, int], budget: TableBudget) -> tuple[int, bool]:
    """Put a cell's value into every grid position its row and column spans cover (within the page's span
    budget; past it, into its own position only). Returns the columns it covers and whether it was clipped."""
    (r, c), (n_rows, max_cols) = at, bounds
    rowspan = cell.get("rowspan")
    rs = n_rows - r if (rowspan or "").strip() == "0" else min(span(rowspan), n_rows - r)
    cs = min(span(cell.get("colspan")), max_cols - c)
    advance = cs  # the columns the cell covers, even when its value is not copied into them
    cost = len(value[0]) * (rs * cs - 1)
    clipped = bool(cost) and budget.span_chars + cost > budget.max_span_chars
    if clipped:
        rs = cs = 1
    else:
        budget.span_chars += cost
    for dr in range(rs):
        for dc in range(cs):
            grid.setdefault((r + dr, c + dc), value)
    return advance, clipped


def make_table(
    grid: dict[tuple[int, int], tuple[str, bool]], n_rows: int, width: int, caption: str
) -> Table | None:
    """Pick the header row(s), pad ragged rows, drop empty rows, make header names unique.

    The first row is the header. When it is all ``th``, following all-``th`` rows are header rows too
    (grouped headers such as "Legacy" spanning "Install | Upgrade" become "Legacy Install", ...).
    A table with a single row has no header: its row is data under "Column 1", "Column 2", ...
    """
    empty = ("", False)
    matrix = [[grid.get((r, c), empty) for c in range(width)] for r in range(n_rows)]
    matrix = [row for row in matrix if any(v for v, _ in row)]
    if not matrix or width == 0:
        return None
    if len(matrix) == 1:
        headers = [""] * width
        body = matrix
    else:
        n_head = 1
        if all(th for _, th in matrix[0]):
            while n_head < len(matrix) - 1 and all(th for _, th in matrix[n_head]):
                n_head += 1
        headers = [_join_header([matrix[r][c][0] for r in range(n_head)]) for c in range(width)]
        body = matrix[n_head:]
    return Table(
        headers=_unique_headers(headers),
        rows=tuple(tuple(v for v, _ in row) for row in body),
        caption=caption,
    )


def _join_header(parts: list[str]) -> str:
    """Stack header cells of one column, skipping the repeats a rowspan produces."""
    out: list[str] = []
    for part in parts:
        if part and (not out or out[-1] != part):
            out.append(part)
    return " ".join(out)


def _unique_headers(headers: list[str]) -> tuple[str, ...]:
    seen: dict[str, int] = {}
    out: list[str] = []
    for i, raw in enumerate(headers, start=1):
        name = raw or f"Column {i}"
        base = name
        n = seen.get(base, 0) + 1
        seen[base] = n
        if n > 1:
            name = f"{base} ({n})"
            while name in seen:
                n += 1
                name = f"{base} ({n})"
            seen[base] = n
        seen.setdefault(name, 1)
        out.append(name)
    return tuple(out)


def cell_label(header: str, value: str) -> str:
    """``Header: value``; a generated "Column N" header adds nothing, so the value stands alone."""
    return value if _GENERIC_HEADER.fullmatch(header) else f"{header}: {value}"
