"""The no-LLM conversational query builder on a scripted thread (earlier questions + own retrieved titles)."""

from __future__ import annotations

import pytest

from pipeline.answer.query_builder import PriorTurn, build_query, content_words, is_followup
from pipeline.errors import ConfigError

T1 = PriorTurn(question="What is Alice's todo from the RAG meeting in October?",
               retrieved_titles=("RAG meeting October", "Acme Platform Team Home"))
T2 = PriorTurn(question="And Bruno?", retrieved_titles=("RAG meeting October",))
NEW_TOPIC = "Which host in the Frankfurt server room still uses TPM 1.2?"


def test_first_turn_is_left_alone() -> None:
    assert not is_followup(T1.question, [])
    assert build_query(T1.question, [], strategy="topic") == T1.question


def test_elliptic_second_turn_carries_the_topic() -> None:
    assert is_followup("And Bruno?", [T1])
    q = build_query("And Bruno?", [T1], strategy="topic")
    assert q.startswith("And Bruno?")
    assert T1.question in q and "RAG meeting October" in q
    assert q.count(T1.question) == 1  # the first turn is also the last: named once


def test_third_turn_uses_first_and_previous_question_and_last_title() -> None:
    q = build_query("What about her deadline?", [T1, T2], strategy="topic")
    assert q == f"What about her deadline? {T2.question} {T1.question} RAG meeting October"


def test_self_contained_new_topic_is_left_alone() -> None:
    assert not is_followup(NEW_TOPIC, [T1, T2])
    assert build_query(NEW_TOPIC, [T1, T2], strategy="topic") == NEW_TOPIC


@pytest.mark.parametrize("question", ["und was ist mit Chen?", "Und Dana?", "What about it?", "Who owns it?"])
def test_followup_markers_in_english_and_german(question: str) -> None:
    assert is_followup(question, [T1])


def test_strategies() -> None:
    history = [T1, T2]
    assert build_query("  And Chen?  ", history, strategy="raw") == "And Chen?"
    assert (
        build_query("And Chen?", history, strategy="prev_questions")
        == f"And Chen? {T2.question} {T1.question}"
    )
    assert (
        build_query("And Chen?", history, strategy="prev_questions", max_prev=1) == f"And Chen? {T2.question}"
    )
    assert build_query(NEW_TOPIC, history, strategy="prev_questions").startswith(NEW_TOPIC + " And Bruno?")


def test_unknown_strategy_is_an_error() -> None:
    with pytest.raises(ConfigError, match="unknown query strategy 'bogus'"):
        build_query("And Chen?", [T1], strategy="bogus")


def test_never_uses_gold_answers() -> None:
    """PriorTurn carries the system's own answer, but the builder never puts answers into the query."""
    prior = [PriorTurn(question=T1.question, retrieved_titles=("RAG meeting October",),
                       answer="Prepare the evaluation todo list")]
    assert "evaluation todo" not in build_query("And Bruno?", prior, strategy="topic")


def test_content_words_drop_stopwords_in_both_languages() -> None:
    assert content_words("What is the TPM version of fra-legacy-07?") == ["tpm", "version", "fra-legacy-07"]
    assert content_words("Welche Version hat der Server?") == ["version", "server"]


def test_unknown_strategy_is_an_error_on_the_first_turn_too() -> None:
    with pytest.raises(ConfigError):
        build_query("What is Alice's todo?", [], strategy="bogus")
