"""Evidence builder: RAGonite passages / lists / tables / verbalized rows with neighbour context."""

from __future__ import annotations

import uuid

import pytest
from helpers import build_evidence, parse_storage

from pipeline.errors import ConfigError
from pipeline.ingest.evidence import PASSAGE_CHARS, evidence_id, split_passage, verbalize_row
from pipeline.types import Heading, ListBlock, Page, Paragraph, Table

# The paper's Figure 5 toy page (hand-written here): meeting notes with an action-items table.
FIGURE5 = (
    "<h1>Meeting notes</h1>"
    "<p>We met to plan the RAG evaluation.</p>"
    "<h2>Action items</h2>"
    "<table><tbody><tr><th>Member</th><th>Task</th></tr>"
    "<tr><td>Alice</td><td>Prepare the evaluation todo list</td></tr>"
    "<tr><td>Bob</td><td>Collect benchmark questions</td></tr></tbody></table>"
    "<p>Next meeting in November.</p>"
    "<ul><li>Book room</li><li>Send invite</li></ul>"
    "<h2>Decisions</h2><p>Use hybrid retrieval.</p>"
)
ROW1 = "Row 1 in Table 1: Member is Alice, and Task is Prepare the evaluation todo list"
ROW2 = "Row 2 in Table 1: Member is Bob, and Task is Collect benchmark questions"


def _page(body: str = FIGURE5, **kw: object) -> Page:
    fields: dict[str, object] = {
        "id": "123",
        "title": "RAG meeting October",
        "url": "https://wiki.example/pages/123",
        "space": "RAG",
        "body": body,
        "ancestors": ("Team", "Meetings"),
    }
    fields.update(kw)
    return Page(**fields)  # type: ignore[arg-type]


def _build(body: str = FIGURE5, table_indexing: str = "both") -> list:
    page = _page(body)
    return build_evidence(page, parse_storage(page.body, page_id=page.id), table_indexing=table_indexing)


def test_verbalize_row_exact_format_and_empty_cells_skipped() -> None:
    assert (
        verbalize_row(("Member", "Task"), ("Alice", "prepare slides"), row_number=2, table_number=1)
        == "Row 2 in Table 1: Member is Alice, and Task is prepare slides"
    )
    assert verbalize_row(("A", "B", "C"), ("1", "", "3"), row_number=1, table_number=4) == (
        "Row 1 in Table 4: A is 1, and C is 3"
    )
    assert verbalize_row(("A", "B"), ("", " "), row_number=1, table_number=1) == ""


def test_figure5_sequence_kinds_texts_and_neighbours() -> None:
    evs = _build()
    got = [(e.kind, e.text, e.before, e.after) for e in evs]
    assert got == [
        ("passage", "We met to plan the RAG evaluation.", "", ROW1),
        ("table", f"{ROW1}\n{ROW2}", "We met to plan the RAG evaluation.", "Next meeting in November."),
        ("row", ROW1, "We met to plan the RAG evaluation.", ROW2),
        ("row", ROW2, ROW1, "Next meeting in November."),
        ("passage", "Next meeting in November.", ROW2, "Book room"),
        ("list", "Book room\nSend invite", "Next meeting in November.", "Use hybrid retrieval."),
        ("passage", "Use hybrid retrieval.", "Send invite", ""),
    ]


def test_figure5_metadata_headings_positions_indices() -> None:
    evs = _build()
    assert [e.position for e in evs] == list(range(7))
    assert [e.headings for e in evs] == [
        ("Meeting notes",),
        ("Meeting notes", "Action items"),
        ("Meeting notes", "Action items"),
        ("Meeting notes", "Action items"),
        ("Meeting notes", "Action items"),
        ("Meeting notes", "Action items"),
        ("Meeting notes", "Decisions"),
    ]
    assert [(e.table_index, e.row_index) for e in evs] == [
        (None, None),
        (1, None),
        (1, 1),
        (1, 2),
        (None, None),
        (None, None),
        (None, None),
    ]
    first = evs[0]
    assert (first.page_id, first.title, first.url, first.space) == (
        "123",
        "RAG meeting October",
        "https://wiki.example/pages/123",
        "RAG",
    )
    assert all(e.breadcrumb == ("Team", "Meetings") for e in evs)
    assert evs[-1].heading == "Decisions"


def test_ids_are_deterministic_uuid5_and_unique() -> None:
    a, b = _build(), _build()
    assert [e.id for e in a] == [e.id for e in b]
    assert len({e.id for e in a}) == len(a)
    row = a[2]
    import hashlib

    digest = hashlib.sha1(row.text.encode()).hexdigest()[:12]
    assert row.id == str(uuid.uuid5(uuid.NAMESPACE_URL, f"123:row:2:{digest}"))
    assert row.id == evidence_id("123", "row", 2, row.text)
    changed = _build(FIGURE5.replace("Alice", "Alicia"))
    assert changed[2].id != row.id and changed[0].id == a[0].id


def test_table_indexing_rows_only_and_tables_only() -> None:
    rows = _build(table_indexing="rows")
    assert [e.kind for e in rows] == ["passage", "row", "row", "passage", "list", "passage"]
    assert rows[0].after == ROW1 and rows[3].before == ROW2
    assert [e.position for e in rows] == list(range(6))
    tables = _build(table_indexing="tables")
    assert [e.kind for e in tables] == ["passage", "table", "passage", "list", "passage"]
    # a table neighbour still contributes its nearest row, even when rows are not indexed
    assert tables[0].after == ROW1 and tables[2].before == ROW2
    with pytest.raises(ConfigError, match="table_indexing"):
        _build(table_indexing="cells")


def test_consecutive_paragraphs_join_and_heading_path_pops() -> None:
    elements = [
        Heading(1, "A"),
        Paragraph("p1"),
        Paragraph("p2"),
        Heading(2, "B"),
        Heading(3, "C"),
        Paragraph("under C"),
        Heading(2, "D"),
        Paragraph("under D"),
        Heading(1, "E"),
        Paragraph("under E"),
    ]
    evs = build_evidence(_page(""), elements)
    assert [(e.text, e.headings) for e in evs] == [
        ("p1\np2", ("A",)),
        ("under C", ("A", "B", "C")),
        ("under D", ("A", "D")),
        ("under E", ("E",)),
    ]
    # neighbours cross heading boundaries
    assert evs[1].before == "p1\np2" and evs[1].after == "under D"


def test_lists_and_tables_interrupt_passages_and_empty_rows_skipped() -> None:
    elements = [
        Paragraph("intro"),
        ListBlock(("x", "  y")),
        Paragraph("middle"),
        Table(headers=("H1", "H2"), rows=(("", ""), ("a", ""), ("", "b"))),
        Table(headers=("K",), rows=(("v",),)),
    ]
    evs = build_evidence(_page(""), elements)
    assert [(e.kind, e.text) for e in evs] == [
        ("passage", "intro"),
        ("list", "x\n  y"),
        ("passage", "middle"),
        ("table", "Row 2 in Table 1: H1 is a\nRow 3 in Table 1: H2 is b"),
        ("row", "Row 2 in Table 1: H1 is a"),
        ("row", "Row 3 in Table 1: H2 is b"),
        ("table", "Row 1 in Table 2: K is v"),
        ("row", "Row 1 in Table 2: K is v"),
    ]
    assert evs[1].before == "intro" and evs[1].after == "middle"
    assert evs[2].before == "y"  # the list's nearest (last) item
    assert [e.row_index for e in evs if e.kind == "row"] == [2, 3, 1]
    assert evs[-1].before == "Row 3 in Table 1: H2 is b" and evs[-1].after == ""


def test_empty_page_gives_no_evidence() -> None:
    assert build_evidence(_page(""), []) == []


def test_long_passage_split_at_paragraph_and_sentence_boundaries() -> None:
    sentence = "This sentence is about forty characters. "
    long_paragraph = (sentence * 80).strip()  # ~3300 chars, one paragraph
    chunks = split_passage(["short intro", long_paragraph, "tail"])
    assert all(len(c) <= PASSAGE_CHARS for c in chunks)
    assert len(chunks) == 3
    assert chunks[0].startswith("short intro\nThis sentence")
    assert all(c.rstrip().endswith(".") for c in chunks[:-1])
    assert chunks[-1].endswith("\ntail")
    # nothing lost: words survive in order
    assert " ".join(" ".join(chunks).split()) == " ".join(
        " ".join(["short intro", long_paragraph, "tail"]).split()
    )


def test_long_code_split_at_lines_and_unbroken_token_hard_cut() -> None:
    code = "\n".join(f"line {i:04d} = value" for i in range(200))  # ~3600 chars
    chunks = split_passage([code], limit=1000)
    assert all(len(c) <= 1000 for c in chunks)
    assert "\n".join(chunks) == code
    blob = "x" * 2500
    assert split_passage([blob], limit=1000) == ["x" * 1000, "x" * 1000, "x" * 500]


def test_long_passage_chunks_are_neighbours() -> None:
    paragraphs = [f"Paragraph {i} " + "word " * 60 for i in range(20)]  # ~6600 chars
    evs = build_evidence(_page(""), [Heading(2, "Long"), *(Paragraph(p) for p in paragraphs)])
    assert len(evs) > 3 and all(e.kind == "passage" and e.headings == ("Long",) for e in evs)
    assert all(len(e.text) <= PASSAGE_CHARS for e in evs)
    assert evs[1].before == evs[0].text and evs[1].after == evs[2].text
