"""Citation markers: parsing, mapping evidence to pages, renumbering and dropping."""

from __future__ import annotations

import pytest

from pipeline.answer.citations import is_out_of_scope, parse_citations
from pipeline.answer.prompts import OUT_OF_SCOPE
from pipeline.types import Evidence, Hit


def hit(eid: str, page: str, rank: int = 1) -> Hit:
    ev = Evidence(id=eid, page_id=page, title=f"Title {page}", url=f"https://wiki/x/{page}", space="ENG",
                  kind="passage", position=0, text=f"text of {eid}")
    return Hit(evidence=ev, score=1.0 / rank, rank=rank)


# sources 1..5: pages A, B, A, C, B
SOURCES = [hit("e1", "A"), hit("e2", "B"), hit("e3", "A"), hit("e4", "C"), hit("e5", "B")]


@pytest.mark.parametrize(("raw", "clean"), [
    ("Alice leads it [Source 2].", "Alice leads it [1]."),
    ("Alice [Sources 2, 4].", "Alice [1][2]."),
    ("Alice [2].", "Alice [1]."),
    ("Alice [2][4].", "Alice [1][2]."),
    ("Alice [2, 4].", "Alice [1][2]."),
    ("Alice [Source 2] [Source 4].", "Alice [1][2]."),
    ("Alice [source 2 and source 4].", "Alice [1][2]."),
    ("Alice (Source 2).", "Alice [1]."),
])
def test_marker_forms(raw: str, clean: str) -> None:
    text, cits = parse_citations(raw, SOURCES)
    assert text == clean
    assert [(c.number, c.url) for c in cits][:2] == [(1, "https://wiki/x/B"), (2, "https://wiki/x/C")][
        : len(cits)
    ]


def test_evidence_of_one_page_merge_into_one_citation_in_first_appearance_order() -> None:
    text, cits = parse_citations("X [Source 4]. Y [Source 1]. Z [Source 3][Source 1]. W [5][2].", SOURCES)
    assert text == "X [1]. Y [2]. Z [2]. W [3]."
    assert [c.number for c in cits] == [1, 2, 3]
    assert [c.url for c in cits] == ["https://wiki/x/C", "https://wiki/x/A", "https://wiki/x/B"]
    assert cits[1].evidence_ids == ("e1", "e3")
    assert cits[2].evidence_ids == ("e5", "e2")
    assert cits[1].title == "Title A" and cits[1].space == "ENG"


def test_markers_pointing_nowhere_are_removed() -> None:
    text, cits = parse_citations("Fact one [7]. Fact two [0][Source 2]. Fact three [Sources 2, 9].", SOURCES)
    assert text == "Fact one. Fact two [1]. Fact three [1]."
    assert len(cits) == 1 and cits[0].evidence_ids == ("e2",)
    text, cits = parse_citations("[3] Only a marker", [])
    assert text == "Only a marker" and cits == []


def test_no_markers_and_non_marker_brackets_untouched() -> None:
    raw = "Use the [config] file (see section 2).\n\nThen [restart]."
    assert parse_citations(raw, SOURCES) == (raw, [])


def test_paragraph_breaks_survive() -> None:
    text, _ = parse_citations("First [1].\n\n[2] Second.", SOURCES)
    assert text == "First [1].\n\n[2] Second."


@pytest.mark.parametrize("text", [
    OUT_OF_SCOPE, f"  {OUT_OF_SCOPE.lower()}  ", f'"{OUT_OF_SCOPE[:-1]}"', f"**{OUT_OF_SCOPE}**\n",
    f"{OUT_OF_SCOPE} [Source 1]", f"No, {OUT_OF_SCOPE.lower()}",  # Qwen2.5-0.5B's lead-in
    f"Sorry, but {OUT_OF_SCOPE.lower()}",
])
def test_out_of_scope_detected(text: str) -> None:
    assert is_out_of_scope(text)


@pytest.mark.parametrize("text", ["", "Alice leads it.", OUT_OF_SCOPE + " But Alice leads it.",
                                  "The desired information cannot be found.",
                                  f"Alice leads it, and otherwise {OUT_OF_SCOPE.lower()}",
                                  f"X{OUT_OF_SCOPE.lower()}",
                                  f"Yes [Source 1]. {OUT_OF_SCOPE}", f"PCR18. {OUT_OF_SCOPE}"])
def test_out_of_scope_not_detected(text: str) -> None:
    assert not is_out_of_scope(text)


async def test_a_streamed_answer_gets_the_final_answers_markers_however_it_is_split() -> None:
    import random

    from pipeline.answer.citations import CitingStream

    hits = [hit("e1", "A", 1), hit("e2", "B", 2), hit("e3", "A", 3)]
    rng = random.Random(7)
    for raw in ("According to the wiki [Source 2], a token [Source 1][Source 3] and (Sources 2, 3). "
                "See [the guide] [Source 9].", "Yes [1, 2]. Also [Source 3 and Source 2]",
                "[Source 2] first. (as of 2024) [x", "a  [Source 1]   [Source 2]  b"):
        want, _ = parse_citations(raw, hits)
        for _ in range(100):
            shown: list[str] = []

            async def sink(text: str, shown: list[str] = shown) -> None:
                shown.append(text)

            stream, i = CitingStream(hits, sink), 0
            while i < len(raw):
                j = min(len(raw), i + rng.randint(1, 6))
                await stream.add(raw[i:j])
                i = j
            await stream.flush()
            assert "".join(shown).strip() == want


def _page(eid: str, page: str, text: str) -> Hit:
    return Hit(evidence=Evidence(id=eid, page_id=page, title=page, url=f"https://wiki/x/{page}", space="ENG",
                                 kind="passage", position=0, text=text), score=1.0, rank=1)


COPIED = [_page("n1", "A", "The reset flag lives in regs[0], see note [3] of the manual. Use m[0][1]. "
                           "Edit [1]."),
          _page("n2", "B", "Other text."), _page("n3", "C", "More text.")]


def test_bracketed_numbers_the_answer_copied_from_a_source_are_page_text() -> None:
    from pipeline.answer.citations import WORD_JOINER

    text, cits = parse_citations("It lives in regs[0], see note [3] [Source 1]. Also see [2].", COPIED)
    assert text.replace(WORD_JOINER, "") == "It lives in regs[0], see note [3] [1]. Also see [2]."
    assert "regs[0]" not in text and "note [3]" not in text  # kept from Slack's and Teams' marker links
    assert [(c.number, c.url) for c in cits] == [(1, "https://wiki/x/A"), (2, "https://wiki/x/B")]
    # a number after another word than the source's is a citation, "it [1]" against "Edit [1]" too
    assert parse_citations("The manual says so [3].", COPIED)[0] == "The manual says so [1]."
    assert parse_citations("Turn it [1].", COPIED)[0] == "Turn it [1]."
    # every copied number of a run, in code spans and whatever the case
    for copied in ("Use m[0][1].", "Type `regs[0]`.", "REGS[0] it is."):
        text, cits = parse_citations(copied, COPIED)
        assert text.replace(WORD_JOINER, "") == copied and text != copied and not cits


def test_source_numbers_read_markers_as_parse_citations_does() -> None:
    from pipeline.answer.citations import cited_numbers, source_numbers

    text = "It lives in regs[0], see note [3] [Source 1]. Also see [2]."
    texts = [h.evidence.text for h in COPIED]
    assert source_numbers(text, texts) == {1, 2} and cited_numbers(text) == {0, 1, 2, 3}


async def test_a_stream_keeps_copied_page_text_however_it_is_split() -> None:
    from pipeline.answer.citations import CitingStream

    raw = "It lives in regs[0], see note [3] [Source 1]."
    want, _ = parse_citations(raw, COPIED)
    for cut in range(1, len(raw)):
        shown: list[str] = []

        async def sink(text: str, shown: list[str] = shown) -> None:
            shown.append(text)

        stream = CitingStream(COPIED, sink)
        await stream.add(raw[:cut])
        await stream.add(raw[cut:])
        await stream.flush()
        assert "".join(shown).strip() == want, cut


def test_markers_are_stripped_and_their_numbers_read_in_every_form() -> None:
    from pipeline.answer.citations import cited_numbers, strip_markers

    text = "Alice [Source 2] owns it [1, 3] and Bob (Sources 4 and 5)."
    assert strip_markers(text) == "Alice owns it and Bob."
    assert cited_numbers(text) == {1, 2, 3, 4, 5}
    assert cited_numbers("no markers") == set() and strip_markers(" plain ") == "plain"
