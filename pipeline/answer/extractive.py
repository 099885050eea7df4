"""The offline answerer: quote the best-matching sentence(s) or table row(s) instead of generating.

Used when no LLM endpoint is configured, so evident still answers (with citations) out of the box.
Units are scored by stemmed word overlap with the question, plus a small bonus for higher-ranked
evidence; a verbalized table row counts as one unit, never split at its commas or periods. With the
embedder at hand (``extractive_answer_dense``), the units of the top evidence also get their cross-lingual
dense similarity to the question. It breaks ties between units with equal overlap, and when the question is
in another language than the evidence (a German question over English pages: few shared words), a unit at
least ``MIN_SIMILARITY`` close answers instead of "cannot be found". Within one language a question that
shares no word with the evidence is still refused: e5's cosines do not separate off-topic questions from
on-topic ones (an English question about bread scored 0.82 against a runbook sentence), word overlap does.
"""

from __future__ import annotations

import asyncio
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import Stemmer

from pipeline.answer.budget import split_units
from pipeline.answer.citations import as_written, parse_citations
from pipeline.answer.prompts import OUT_OF_SCOPE
from pipeline.errors import EmbeddingError
from pipeline.protocols import Embedder
from pipeline.types import Answer, AnswerTrace, Hit

MODEL = "extractive"
RANK_WEIGHT = 0.25  # a full extra matching word outweighs any rank difference
DENSE_WEIGHT = 4.0  # e5 cosines of units differ by hundredths: a tie-breaker, rarely worth a whole word
DENSE_HITS = 5  # units of this many top hits are embedded (~15 short texts, cached per text)
# across languages, a unit sharing no word must be this close (dev: best unit ≥ 0.84 for 75 %)  # a unit
# sharing no word must be this close (dev questions: best unit ≥ 0.84 for 75 %)
MIN_SIMILARITY = 0.80

_WORD = re.compile(r"\w+", re.UNICODE)
_STOPWORDS_EN = (
    "a an and are as at be been but by can could did do does for from had has have how i if in into is it "
    "its "
    "me my of on or our should so that the their them then there these they this to us was we were what when "
    "where which who whom whose why will with would you your about any all also"
)
_STOPWORDS_DE = (
    "der die das den dem des ein eine einer eines einem einen und oder ist sind war wer wie was wo wann "
    "warum "
    "welche welcher welches im in am an auf für mit von zu zum zur bei ich du er sie es wir ihr uns nicht "
    "auch "
    "hat haben wird werden kann können"
)
_EN, _DE = frozenset(_STOPWORDS_EN.split()), frozenset(_STOPWORDS_DE.split())
_STOPWORDS = _EN | _DE


@dataclass(frozen=True)
class _Candidate:
    score: float
    overlap: int
    hit_index: int  # 0-based position in ``hits``
    unit_index: int
    text: str


class Terms:
    """Lower-cased, stop-word-free, stemmed tokens (English Snowball stems also conflate most plurals)."""

    def __init__(self) -> None:
        self._stemmer = Stemmer.Stemmer("english")

    def __call__(self, text: str) -> set[str]:
        words = [
            w for w in _WORD.findall(text.lower()) if w not in _STOPWORDS and (len(w) > 1 or w.isdigit())
        ]
        return set(self._stemmer.stemWords(words))


async def extractive_answer_dense(question: str, hits: Sequence[Hit], embedder: Embedder) -> Answer:
    """``extractive_answer`` with the dense similarity of the top hits' units; plain overlap scoring when the
    embedder fails. All of it off the event loop: stemming every unit of ten long hits took 137 ms."""

    def answer() -> Answer:
        units = sorted({u for h in hits[:DENSE_HITS] for u in _units(h.evidence.text)})
        if not units:
            return extractive_answer(question, hits)
        try:
            q = embedder.embed_queries([question])[0]
            scores = (embedder.embed_documents(units) @ q).tolist()
        except EmbeddingError:
            return extractive_answer(question, hits)
        return extractive_answer(question, hits, similarity=dict(zip(units, scores, strict=True)))

    return await asyncio.to_thread(answer)


def extractive_answer(question: str, hits: Sequence[Hit], *, max_sentences: int = 2,
                      similarity: Mapping[str, float] | None = None) -> Answer:
    """Answer with up to ``max_sentences`` quoted units, each cited ``[n]`` (n = position in ``hits``)
    and mapped to per-page citations; the out-of-scope sentence when nothing overlaps the question (or, with
    ``similarity`` (unit -> cosine to the question), is at least ``MIN_SIMILARITY`` close)."""
    terms = Terms()
    q = terms(question)
    sims = similarity or {}
    if sims and not _cross_lingual(question, hits):
        sims = {u: v for u, v in sims.items() if q & terms(u)}  # a tie-breaker only
    candidates: list[_Candidate] = []
    for i, hit in enumerate(hits):
        bonus = RANK_WEIGHT / (i + 1)
        for j, unit in enumerate(_units(hit.evidence.text)):
            overlap = len(q & terms(unit)) if q else 0
            sim = sims.get(unit)
            if overlap or (sim is not None and sim >= MIN_SIMILARITY):
                # Gently prefer short units so a matching row beats a long paragraph with the same words.
                score = overlap + bonus - 0.01 * math.log1p(len(unit)) + DENSE_WEIGHT * (sim or 0.0)
                candidates.append(_Candidate(score, overlap, i, j, unit))
    if not candidates:
        return Answer(text=OUT_OF_SCOPE, out_of_scope=True, extractive=True, model=MODEL, evidence=list(hits),
                      trace=AnswerTrace(question_terms=sorted(q)))
    candidates.sort(key=lambda c: (-c.score, c.hit_index, c.unit_index))
    best = candidates[0]
    chosen = [best]
    for c in candidates[1:]:
        if len(chosen) >= max_sentences:
            break
        # near-equally relevant extras
        if c.overlap and c.overlap * 2 >= best.overlap and c.text != best.text:
            chosen.append(c)
    chosen.sort(key=lambda c: (c.hit_index, c.unit_index))  # read in source order
    raw = " ".join(_cite(c.text, c.hit_index + 1) for c in chosen)
    text, citations = parse_citations(raw, hits)
    return Answer(
        text=text,
        citations=citations,
        extractive=True,
        model=MODEL,
        evidence=list(hits),
        trace=AnswerTrace(question_terms=sorted(q), unit_scores=[round(c.score, 4) for c in chosen],
                          raw_answer=raw),  # cited by position in ``hits`` (an LLM's draft, ``draft`` style)
    )


def text_language(text: str) -> str | None:
    """"en" or "de" by stop words (the two languages evident's tests and dev split hold), None when unsure."""
    words = _WORD.findall(text.lower())
    en, de = sum(w in _EN for w in words), sum(w in _DE for w in words)
    return None if en == de else ("en" if en > de else "de")


def _cross_lingual(question: str, hits: Sequence[Hit]) -> bool:
    asked = text_language(question)
    found = text_language(" ".join(h.evidence.text for h in hits[:DENSE_HITS]))
    return asked is not None and found is not None and asked != found


def _units(text: str) -> list[str]:
    """Sentences and whole table rows, stripped, empty ones dropped."""
    return [u.strip() for u in split_units(text) if u.strip()]


def _cite(unit: str, n: int) -> str:
    """'fact [1].' rather than 'fact. [1]'; the unit's own "[3]" or "array[0]" stays page text."""
    unit = as_written(unit)
    return f"{unit[:-1]} [{n}]." if unit.endswith(".") else f"{unit} [{n}]"
