"""The offline extractive answerer on hand-made hits."""

from __future__ import annotations

from typing import Any

import pytest

from pipeline.answer.extractive import extractive_answer
from pipeline.answer.prompts import OUT_OF_SCOPE
from pipeline.types import Answer, Evidence, EvidenceKind, Hit


def hit(eid: str, page: str, text: str, rank: int, kind: EvidenceKind = "passage") -> Hit:
    ev = Evidence(id=eid, page_id=page, title=f"Page {page}", url=f"https://wiki/x/{page}", space="ENG",
                  kind=kind, position=rank, text=text)
    return Hit(evidence=ev, score=1.0 / rank, rank=rank)


HITS = [
    hit(
        "e1", "A", "The onboarding checklist is maintained by HR. New laptops are ordered two weeks ahead.", 1
    ),
    hit(
        "e2",
        "B",
        "Row 2 in Table 1: Member is Alice Smith, and Task is Prepare the Q3 budget review. "
        "Due date is 5 May.",
        2,
        "row",
    ),
    hit("e3", "A", "Laptops are ordered through the IT portal.", 3),
    hit("e4", "C", "Quarterly planning happens in the first week of each quarter.", 4),
]


def test_best_sentence_is_quoted_and_cited_per_page() -> None:
    a = extractive_answer("Who orders the new laptops?", HITS, max_sentences=1)
    assert a.text == "New laptops are ordered two weeks ahead [1]."
    assert a.extractive and a.model == "extractive" and not a.out_of_scope
    assert [(c.number, c.url, c.evidence_ids) for c in a.citations] == [(1, "https://wiki/x/A", ("e1",))]
    assert a.evidence == HITS


def test_verbalized_row_is_one_unit() -> None:
    a = extractive_answer("What is Alice's task?", HITS, max_sentences=1)
    row = HITS[1].evidence.text
    assert a.text == row[:-1] + " [1]."  # the whole row, commas and inner periods included
    assert a.citations[0].url == "https://wiki/x/B" and a.citations[0].evidence_ids == ("e2",)


def test_two_sentences_from_one_page_share_a_citation() -> None:
    a = extractive_answer("How are laptops ordered?", HITS, max_sentences=2)
    assert (
        a.text
        == "New laptops are ordered two weeks ahead [1]. Laptops are ordered through the IT portal [1]."
    )
    assert len(a.citations) == 1 and a.citations[0].evidence_ids == ("e1", "e3")


def test_rank_breaks_ties() -> None:
    same = [hit("x1", "P", "The budget owner is Carol.", 1), hit("x2", "Q", "The budget owner is Dave.", 2)]
    assert (
        extractive_answer("Who is the budget owner?", same, max_sentences=1).text
        == "The budget owner is Carol [1]."
    )
    flipped = list(reversed(same))
    assert (
        extractive_answer("Who is the budget owner?", flipped, max_sentences=1).text
        == "The budget owner is Dave [1]."
    )


def test_no_overlap_or_no_hits_is_out_of_scope() -> None:
    for a in (extractive_answer("What is the wifi password?", HITS),
              extractive_answer("Who orders laptops?", []),
              extractive_answer("Who is it?", HITS)):  # stop words only
        assert a.text == OUT_OF_SCOPE and a.out_of_scope and a.citations == [] and a.extractive


# ---------------------------------------------------------------------- dense similarity (the embedder at
# hand)

LAPTOPS = "New laptops are ordered two weeks ahead."
PORTAL = "Laptops are ordered through the IT portal."


def test_a_question_in_another_language_is_answered_by_the_closest_unit() -> None:
    question = "Wann werden neue Rechner bestellt?"  # German: no word in common with the English pages
    assert extractive_answer(question, HITS).out_of_scope
    close = {LAPTOPS: 0.86, PORTAL: 0.83}
    a = extractive_answer(question, HITS, max_sentences=1, similarity=close)
    assert a.text == "New laptops are ordered two weeks ahead [1]." and not a.out_of_scope
    far = {LAPTOPS: 0.79, PORTAL: 0.78}  # below MIN_SIMILARITY: still "cannot be found"
    assert extractive_answer(question, HITS, similarity=far).out_of_scope


def test_within_one_language_similarity_never_overrides_a_refusal() -> None:
    a = extractive_answer("How do I bake sourdough bread?", HITS, similarity={LAPTOPS: 0.95, PORTAL: 0.9})
    assert a.out_of_scope  # e5 cosines do not tell off-topic questions apart; shared words do


def test_similarity_breaks_ties_between_units_with_the_same_overlap() -> None:
    question = "How are laptops ordered?"
    # rank wins today
    assert extractive_answer(question, HITS, max_sentences=1).text.startswith("New laptops")
    a = extractive_answer(question, HITS, max_sentences=1, similarity={LAPTOPS: 0.80, PORTAL: 0.88})
    assert a.text == "Laptops are ordered through the IT portal [1]." and a.citations[0].evidence_ids == (
        "e3",
    )


class _Embedder:
    """A deterministic embedder: a unit's vector points at the question's when it mentions "portal"."""

    name, dim, max_tokens = "toy", 2, 128

    def __init__(self, fail: bool = False) -> None:
        self.fail, self.embedded = fail, []  # type: ignore[var-annotated]

    def embed_queries(self, texts):  # type: ignore[no-untyped-def]
        import numpy as np

        return np.array([[1.0, 0.0]] * len(texts))

    def embed_documents(self, texts):  # type: ignore[no-untyped-def]
        import numpy as np

        from pipeline.errors import EmbeddingError

        if self.fail:
            raise EmbeddingError("the model is gone")
        self.embedded.extend(texts)
        return np.array([[0.9, 0.436] if "portal" in t else [0.8, 0.6] for t in texts])

    def close(self) -> None:
        pass


async def test_the_engine_path_embeds_the_top_units_and_falls_back_to_overlap() -> None:
    from pipeline.answer.extractive import DENSE_HITS, extractive_answer_dense

    toy = _Embedder()
    a = await extractive_answer_dense("How are laptops ordered?", HITS, toy)  # type: ignore[arg-type]
    assert set(toy.embedded) >= {LAPTOPS, PORTAL} and len(HITS) <= DENSE_HITS
    portal, laptops = a.trace.unit_scores[1], a.trace.unit_scores[0]  # in source order: e1's unit, then e3's
    assert "IT portal" in a.text and portal > laptops  # the closer unit scores higher
    broken = await extractive_answer_dense("How are laptops ordered?", HITS, _Embedder(fail=True))
    assert broken.text == extractive_answer("How are laptops ordered?", HITS).text  # overlap only, no error


async def test_the_engine_path_scores_units_off_the_event_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """Stemming every unit of ten long hits is CPU work: on the loop it blocked serve (137 ms)."""
    import threading

    import pipeline.answer.extractive as extractive
    from pipeline.answer.extractive import extractive_answer_dense

    scored_in: list[str] = []
    original = extractive.extractive_answer

    def spy(*args: Any, **kwargs: Any) -> Answer:
        scored_in.append(threading.current_thread().name)
        return original(*args, **kwargs)

    monkeypatch.setattr(extractive, "extractive_answer", spy)
    a = await extractive_answer_dense("How are laptops ordered?", HITS, _Embedder())  # type: ignore[arg-type]
    assert "IT portal" in a.text
    assert scored_in and threading.main_thread().name not in scored_in


def test_bracketed_numbers_in_page_text_are_quoted_not_cited() -> None:
    from pipeline.answer.citations import WORD_JOINER

    hits = [hit("n1", "A", "The reset flag lives in regs[0], see note [3] of the manual.", 1),
            hit("n2", "B", "Unrelated text.", 2), hit("n3", "C", "More unrelated text.", 3)]
    a = extractive_answer("Where does the reset flag live?", hits, max_sentences=1)
    shown = a.text.replace(WORD_JOINER, "")
    assert shown == "The reset flag lives in regs[0], see note [3] of the manual [1]."
    assert [(c.number, c.url) for c in a.citations] == [(1, "https://wiki/x/A")]  # page C is not cited
