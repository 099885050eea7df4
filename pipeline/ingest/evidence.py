"""Page elements -> RAGonite evidence: passages, lists, whole tables and verbalized table rows.

Each evidence records its heading path and its nearest neighbours' text (``before``/``after``), so
the contextualized text can be rebuilt from the evidence alone. A table or list neighbour contributes
only its nearest row or item, as in the paper (the passage after a table sees the table's last row).

Long passages are split at about ``PASSAGE_CHARS`` characters, at paragraph boundaries first, then
sentence, line and word boundaries: one evidence must stay within what an embedding model reads
(~512 tokens), and a focused passage ranks better than a whole page section.
"""

from __future__ import annotations

import hashlib
import re
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from pipeline.errors import ConfigError
from pipeline.types import Element, Evidence, EvidenceKind, Heading, ListBlock, Page, Paragraph, Table

PASSAGE_CHARS = 1500
TABLE_INDEXING = ("rows", "tables", "both")

_NEWLINE = re.compile(r"\n")
_SENTENCE_END = re.compile(r"(?<=[.!?])[ \t]+")
_SPACES = re.compile(r"[ \t]+")


def verbalize_row(headers: Sequence[str], row: Sequence[str], *, row_number: int, table_number: int) -> str:
    """``Row 2 in Table 1: Member is Alice, and Task is prepare slides`` (empty cells skipped).

    Returns "" when every cell is empty.
    """
    parts = [f"{h} is {v}" for h, v in zip(headers, row, strict=False) if v.strip()]
    if not parts:
        return ""
    return f"Row {row_number} in Table {table_number}: " + ", and ".join(parts)


LINEARIZATIONS = ("verbalized", "markdown", "plain")


def linearize_row(
    headers: Sequence[str],
    row: Sequence[str],
    *,
    row_number: int,
    table_number: int,
    style: str = "verbalized",
) -> str:
    """One table row as text. ``verbalized`` is RAGonite's; ``markdown`` and ``plain`` exist for the
    paper's linearization ablation. Returns "" when every cell is empty."""
    if style == "verbalized":
        return verbalize_row(headers, row, row_number=row_number, table_number=table_number)
    if not any(v.strip() for v in row):
        return ""
    if style == "markdown":
        return "| " + " | ".join(headers) + " |\n|" + "---|" * len(headers) + "\n| " + " | ".join(row) + " |"
    if style == "plain":
        return " ".join(v for v in row if v.strip())
    raise ConfigError(f"linearization must be one of {', '.join(LINEARIZATIONS)}, got {style!r}")


def evidence_id(page_id: str, kind: str, position: int, text: str) -> str:
    """Deterministic id: the same page version always yields the same ids (idempotent re-indexing)."""
    digest = hashlib.sha1(text.encode("utf-8")).hexdigest()[:12]
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"{page_id}:{kind}:{position}:{digest}"))


@dataclass
class _Unit:
    """One passage chunk, list or table in document order, before ids and neighbours are assigned."""

    kind: EvidenceKind
    text: str
    headings: tuple[str, ...]
    pieces: tuple[str, ...]  # list items / verbalized rows; (text,) for a passage
    table_index: int | None = None
    row_numbers: tuple[int, ...] = ()  # 1-based data row number of each verbalized row


MAX_EVIDENCE_CHARS = 64_000  # above the largest ConfQuestions table (41,891 characters)


def build_evidence(
    page: Page,
    elements: Sequence[Element],
    *,
    table_indexing: str,
    linearization: str,
    max_chars: int,
    notes: list[str] | None = None,
) -> list[Evidence]:
    """Turn one page's elements into evidence in document order (a table precedes its rows).

    A table or list longer than ``max_chars`` becomes several evidence of consecutive rows or items
    (nothing is lost); a single row longer than that is cut, and ``notes`` says so.
    """
    if table_indexing not in TABLE_INDEXING:
        raise ConfigError(
            f"table_indexing must be one of {', '.join(TABLE_INDEXING)}, got {table_indexing!r}"
        )
    if linearization not in LINEARIZATIONS:
        raise ConfigError(f"linearization must be one of {', '.join(LINEARIZATIONS)}, got {linearization!r}")
    units = _units(elements, linearization, max_chars, notes if notes is not None else [])
    out = _PageEvidence(page)
    for i, unit in enumerate(units):
        before = units[i - 1].pieces[-1] if i > 0 else ""
        after = units[i + 1].pieces[0] if i + 1 < len(units) else ""
        if unit.kind != "table":
            out.add(unit.kind, unit.text, unit, before, after)
            continue
        if table_indexing in ("tables", "both"):
            out.add("table", unit.text, unit, before, after)
        if table_indexing in ("rows", "both"):
            rows = unit.pieces
            for r, row_text in enumerate(rows):
                out.add("row", row_text, unit, rows[r - 1] if r > 0 else before,
                        rows[r + 1] if r + 1 < len(rows) else after, row=unit.row_numbers[r])
    return out.evidence


class _PageEvidence:
    """A page's evidence in document order, each knowing its position and neighbours."""

    def __init__(self, page: Page) -> None:
        self.page = page
        self.evidence: list[Evidence] = []

    def add(self, kind: EvidenceKind, text: str, unit: _Unit, before: str, after: str,
            row: int | None = None) -> None:
        page, position = self.page, len(self.evidence)
        self.evidence.append(Evidence(
            id=evidence_id(page.id, kind, position, text), page_id=page.id, title=page.title, url=page.url,
            space=page.space, kind=kind, position=position, text=text, headings=unit.headings, before=before,
            after=after, breadcrumb=page.ancestors, table_index=unit.table_index, row_index=row,
            access=page.access,
        ))


def _units(elements: Sequence[Element], linearization: str, max_chars: int, notes: list[str]) -> list[_Unit]:
    units: list[_Unit] = []
    path: list[tuple[int, str]] = []
    paragraphs: list[str] = []
    table_number = 0

    def headings() -> tuple[str, ...]:
        return tuple(text for _, text in path)

    def flush() -> None:
        for chunk in split_passage(paragraphs):
            units.append(_Unit("passage", chunk, headings(), (chunk,)))
        paragraphs.clear()

    for element in elements:
        if isinstance(element, Paragraph):
            if element.text.strip():
                paragraphs.append(element.text.strip())
            continue
        flush()
        if isinstance(element, Heading):
            if element.text.strip():
                while path and path[-1][0] >= element.level:
                    path.pop()
                path.append((element.level, element.text.strip()))
        elif isinstance(element, ListBlock):
            items = [_cap(i, max_chars, notes, "list item") for i in element.items if i.strip()]
            for chunk in _chunks(items, max_chars):
                units.append(_Unit("list", "\n".join(chunk), headings(), tuple(i.strip() for i in chunk)))
        elif isinstance(element, Table):
            table_number += 1
            units += _table_units(element, table_number, headings(), linearization, max_chars, notes)
    flush()
    return units


def _table_units(table: Table, number: int, headings: tuple[str, ...], linearization: str, max_chars: int,
                 notes: list[str]) -> list[_Unit]:
    """A table as one unit of its rows (several when it is longer than ``max_chars``), rows linearized."""
    verbalized = [(r, _cap(text, max_chars, notes, f"row {r} of table {number}"))
                  for r, row in enumerate(table.rows, start=1)
                  if (text := linearize_row(table.headers, row, row_number=r, table_number=number,
                                            style=linearization))]
    caption = (table.caption,) if table.caption else ()
    out: list[_Unit] = []
    for part in _chunks(
        verbalized, max(max_chars // 2, max_chars - len(table.caption)), key=lambda rt: rt[1]
    ):
        rows = tuple(text for _, text in part)
        body: tuple[str, ...] = rows
        if linearization == "markdown":  # the header once, then value lines
            body = (rows[0].rsplit("\n", 1)[0], *(r.rsplit("\n", 1)[1] for r in rows))
        out.append(_Unit("table", "\n".join(caption + body), headings, rows, table_index=number,
                         row_numbers=tuple(r for r, _ in part)))
    return out


T = TypeVar("T")


def _chunks(items: Sequence[T], limit: int, key: Callable[[T], str] = str) -> list[list[T]]:
    """Consecutive runs of ``items`` whose joined text stays within ``limit`` (one run when it all fits)."""
    out: list[list[T]] = []
    current: list[T] = []
    size = 0
    for item in items:
        n = len(key(item)) + 1
        if current and size + n > limit:
            out.append(current)
            current, size = [], 0
        current.append(item)
        size += n
    if current:
        out.append(current)
    return out


def _cap(text: str, limit: int, notes: list[str], what: str) -> str:
    if len(text) <= limit:
        return text
    notes.append(f"{what} cut from {len(text)} to {limit} characters (EVIDENT_MAX_EVIDENCE_CHARS)")
    cut = text.rfind(" ", 0, limit)
    return text[: cut if cut > limit // 2 else limit]


def split_passage(paragraphs: Sequence[str], limit: int = PASSAGE_CHARS) -> list[str]:
    """Pack paragraphs (joined by newlines) into chunks of at most ~``limit`` characters.

    A paragraph longer than ``limit`` is cut at sentence ends, then at line breaks (code), then at
    spaces; only a single unbroken token longer than ``limit`` is hard-cut.
    """
    pieces: list[str] = []
    for paragraph in paragraphs:
        pieces.extend(_split_long(paragraph, limit))
    chunks: list[str] = []
    current = ""
    for piece in pieces:
        if current and len(current) + 1 + len(piece) > limit:
            chunks.append(current)
            current = piece
        else:
            current = f"{current}\n{piece}" if current else piece
    if current:
        chunks.append(current)
    return chunks


def _split_long(text: str, limit: int) -> list[str]:
    if len(text) <= limit:
        return [text]
    for splitter, joiner in ((_NEWLINE, "\n"), (_SENTENCE_END, " "), (_SPACES, " ")):
        parts = [p for p in splitter.split(text) if p]
        if len(parts) > 1:
            return _pack(parts, joiner, limit)
    return [text[i : i + limit] for i in range(0, len(text), limit)]


def _pack(parts: list[str], joiner: str, limit: int) -> list[str]:
    out: list[str] = []
    current = ""
    for part in parts:
        if len(part) > limit:
            if current:
                out.append(current)
                current = ""
            out.extend(_split_long(part, limit))
        elif current and len(current) + len(joiner) + len(part) > limit:
            out.append(current)
            current = part
        else:
            current = f"{current}{joiner}{part}" if current else part
    if current:
        out.append(current)
    return out
