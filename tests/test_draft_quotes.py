"""The draft style's quotes beneath a rewrite (``pipeline/answer/draft_quotes.py``)."""

from __future__ import annotations

from pipeline.answer.draft_quotes import left_out_units, with_quotes

DRAFT = ("Kevin Pearson - AFRL [Source 1]. Row 2 in Table 1: Member is Kevin, and Action is Send the slides "
         "to Bob [Source 3].")
QUESTION = "What is Kevin's action item?"


def test_the_units_a_rewrite_leaves_out_are_quoted_beneath_it_with_their_markers() -> None:
    reply = "Kevin sends the slides to Bob [Source 3]."
    units = left_out_units(reply, QUESTION, DRAFT)
    assert units == ["Kevin Pearson - AFRL [Source 1]."]  # the row is said, the other unit is not
    assert with_quotes(reply, units) == (
        "Kevin sends the slides to Bob [Source 3].\n\n\u201cKevin Pearson - AFRL\u201d [Source 1]")


def test_a_rewrite_that_says_every_unit_gets_nothing_beneath_it() -> None:
    reply = "Kevin Pearson from AFRL sends the slides to Bob [Source 1][Source 3]."
    assert left_out_units(reply, QUESTION, DRAFT) == []
    assert with_quotes(reply, []) == reply


def test_a_unit_counts_as_said_only_with_its_numbers_and_most_of_its_own_words() -> None:
    draft = "The next RAG meeting is on 12 November 2024 [Source 2]."
    question = "When is the next RAG meeting?"
    assert left_out_units("On 12 November 2024 [Source 2].", question, draft) == []
    assert left_out_units("In November [Source 2].", question, draft) == [draft]  # its numbers left out
    # two of three own words ("send", "slide", "bob") count as said; one does not
    row = "Row 2 in Table 1: Member is Kevin, and Action is Send the slides to Bob [Source 3]."
    assert left_out_units("Kevin sends the slides [Source 3].", QUESTION, row) == []
    assert left_out_units("Kevin sends something [Source 3].", QUESTION, row) == [row]
    # the question's numbers count as said
    assert left_out_units("It is the second release [Source 1].", "What is release 4.2?",
                          "Release 4.2 is the second release [Source 1].") == []


def test_another_language_than_the_quote_gets_the_units_with_words_of_their_own_quoted() -> None:
    reply = "Kevin schickt die Folien an Bob [Source 3]."  # German over an English quote
    assert left_out_units(reply, "Was ist Kevins Aufgabe?", DRAFT) == DRAFT_UNITS


def test_each_unit_quoted_beneath_is_a_paragraph_of_its_own() -> None:
    assert with_quotes("Kevin [Source 1]", DRAFT_UNITS) == (
        "Kevin [Source 1]\n\n\u201cKevin Pearson - AFRL\u201d [Source 1]\n\n"
        "\u201cRow 2 in Table 1: Member is Kevin, and Action is Send the slides to Bob\u201d [Source 3]")


def test_a_rewrite_citing_a_source_the_draft_does_not_is_a_correction_and_gets_nothing_beneath() -> None:
    draft = "The cluster has 9 nodes [Source 2]. It runs in Frankfurt [Source 2]."
    assert left_out_units("The cluster has 12 nodes [Source 3].", "How many nodes?", draft) == []
    # the same rewrite citing the draft's source: the unit it leaves out is quoted
    assert left_out_units("The cluster has 9 nodes [Source 2].", "How many nodes?", draft) == [
        "It runs in Frankfurt [Source 2]."]
    # a bracketed number copied from a source's text is no citation
    sources = ["", "The cluster has 9 nodes.", "See regs[3] for the layout."]
    assert left_out_units("The cluster has 9 nodes, see regs[3] [Source 2].", "How many nodes?", draft,
                          sources) == ["It runs in Frankfurt [Source 2]."]


def test_a_rewrite_that_corrects_the_draft_from_its_source_gets_nothing_beneath() -> None:
    """The guard keeps a rewrite that corrects a number or words from the sources, citing the same source;
    the draft's unit quoted beneath it contradicted it ("12 nodes", then "9 nodes")."""
    question = "How many nodes does the cluster have?"
    draft = "The cluster has 9 nodes [Source 2]."
    sources = ["", "The old cluster had 9 nodes. The cluster has 12 nodes since May."]
    assert left_out_units("The cluster has 12 nodes [Source 2].", question, draft, sources) == []
    # no source has the number: the rewrite is no correction, and the draft's unit is quoted
    assert left_out_units("The cluster has 14 nodes [Source 2].", question, draft, sources) == [draft]


def test_a_number_the_question_gives_or_a_lists_numbering_is_no_correction() -> None:
    """Any number the draft lacks counted as a correction, so a numbered rewrite, or one repeating the
    question's release number, lost the quotes of the units it left out."""
    question = "How do I reset the admin password of release 4.2?"
    draft = "Hold the reset button for 30 seconds [Source 1]. Then log in as admin [Source 1]."
    sources = ["Row 1 in Table 1: Step is Hold the reset button for 30 seconds. Release 4.2 resets the admin "
               "password."]
    numbered = "1. Hold the reset button [Source 1]. 2. Log in again [Source 1]."
    assert left_out_units(numbered, question, draft, sources) == [
        "Hold the reset button for 30 seconds [Source 1]."]  # its seconds left out; logging in is said
    repeated = "In release 4.2, hold the reset button [Source 1]."
    assert left_out_units(repeated, question, draft, sources) == [
        "Hold the reset button for 30 seconds [Source 1].", "Then log in as admin [Source 1]."]


def test_nothing_is_added_without_a_draft_or_an_answer() -> None:
    assert left_out_units("Kevin sends the slides [Source 3].", QUESTION, "") == []
    assert left_out_units("", QUESTION, DRAFT) == []


DRAFT_UNITS = ["Kevin Pearson - AFRL [Source 1].",
               "Row 2 in Table 1: Member is Kevin, and Action is Send the slides to Bob [Source 3]."]
