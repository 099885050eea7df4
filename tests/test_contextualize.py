"""Contextualized index text and LLM prompt text, derived from an Evidence alone."""

from __future__ import annotations

from dataclasses import replace

import pytest
from helpers import build_evidence, parse_storage

from pipeline.errors import ConfigError
from pipeline.ingest.contextualize import clip, clip_tail, contextualize, prompt_text
from pipeline.types import Evidence, Page

ROW1 = "Row 1 in Table 1: Member is Alice, and Task is Prepare the evaluation todo list"


def _row_evidence() -> Evidence:
    body = (
        "<h1>Meeting notes</h1><p>We met to plan the RAG evaluation.</p><h2>Action items</h2>"
        "<table><tr><th>Member</th><th>Task</th></tr>"
        "<tr><td>Alice</td><td>Prepare the evaluation todo list</td></tr>"
        "<tr><td>Bob</td><td>Collect benchmark questions</td></tr></table><p>Next meeting in November.</p>"
    )
    page = Page(
        id="1", title="RAG meeting October", url="u", space="S", body=body, ancestors=("Team", "Meetings")
    )
    evs = build_evidence(page, parse_storage(body))
    return next(e for e in evs if e.kind == "row" and e.row_index == 2)


def test_default_layout_title_heading_before_text_after() -> None:
    ev = _row_evidence()
    assert contextualize(ev) == (
        "RAG meeting October\n"
        "Meeting notes > Action items\n"
        f"{ROW1}\n"
        "Row 2 in Table 1: Member is Bob, and Task is Collect benchmark questions\n"
        "Next meeting in November."
    )


def test_items_select_lines_in_fixed_order() -> None:
    ev = _row_evidence()
    assert contextualize(ev, items=()) == ev.text
    assert (
        contextualize(ev, items=("after", "title"))
        == f"RAG meeting October\n{ev.text}\nNext meeting in November."
    )
    assert contextualize(ev, items=("breadcrumb", "heading")) == (
        f"Team › Meetings\nMeeting notes > Action items\n{ev.text}"
    )
    assert contextualize(ev, items="title") == f"RAG meeting October\n{ev.text}"


def test_unknown_item_raises_config_error_naming_it() -> None:
    with pytest.raises(ConfigError, match="'summary'"):
        contextualize(_row_evidence(), items=("title", "summary"))
    with pytest.raises(ConfigError, match="max_chars"):
        contextualize(_row_evidence(), max_chars=0)


def test_context_items_bounded_but_text_never_cut() -> None:
    ev = replace(
        _row_evidence(),
        title="Title " + "word " * 100,
        before="start " + "alpha " * 100 + "nearest end",
        after="first words " + "omega " * 100,
        text="raw " * 200,
    )
    out = contextualize(ev, max_chars=50).split("\n")
    title, heading, before, text, after = out
    assert len(title) <= 50 and title.startswith("Title word") and title.endswith("…")
    assert len(before) <= 50 and before.startswith("…") and before.endswith("nearest end")
    assert len(after) <= 50 and after.startswith("first words") and after.endswith("…")
    assert text == ev.text
    assert heading == "Meeting notes > Action items"


def test_empty_items_produce_no_blank_lines_and_multiline_context_squeezed() -> None:
    ev = replace(_row_evidence(), headings=(), before="", after="two\nlines")
    assert contextualize(ev) == f"RAG meeting October\n{ev.text}\ntwo lines"


def test_clip_cuts_at_word_boundaries() -> None:
    assert clip("short text", 20) == "short text"
    assert clip("alpha beta gamma", 12) == "alpha beta…"
    assert clip("alpha beta gamma", 11) == "alpha beta…"
    assert clip("alpha beta gamma", 10) == "alpha…"
    assert clip("abcdefghijklmnop", 6) == "abcde…"
    assert clip_tail("alpha beta gamma", 12) == "…beta gamma"
    assert clip_tail("alpha beta gamma", 10) == "…gamma"
    assert clip_tail("abcdefghijklmnop", 6) == "…lmnop"


def test_contextualize_is_deterministic() -> None:
    ev = _row_evidence()
    assert contextualize(ev) == contextualize(_row_evidence())


def test_prompt_text_title_section_and_raw_text() -> None:
    ev = _row_evidence()
    assert prompt_text(ev) == f"Page: RAG meeting October\nSection: Meeting notes > Action items\n{ev.text}"
    bare = replace(ev, headings=(), title="")
    assert prompt_text(bare) == ev.text
    long = replace(ev, title="T " * 400)
    assert len(prompt_text(long, max_chars=40).split("\n")[0]) <= len("Page: ") + 40
