"""The ``draft`` style's guard: a model's answer never says less than the quote it was given to rewrite.

With the ``draft`` prompt the model starts from the extractive answer's quote. A small model sometimes drops
it: Qwen2.5-0.5B in German restated the question or replied that the sources hold no answer where the quote
had it (the answer contained the gold in 0.120 of the dev turns against 0.240 for the quote alone;
BENCHMARKS.md, "Answers written from an extractive draft"). Three shapes are recognisable without a judge:

- the reply restates the question: it has no content word (stemmed, stop words and citation markers aside)
  the question does not, it has at least half of the question's, and it cites no source the quote does not,
  while the quote adds words of its own (so "Frankfurt [Source 1]" to "Frankfurt or Berlin?" is no
  restatement, and neither is one that cites another source than the quote);
- or it is empty or the out-of-scope sentence while the quote shares two of the question's content words, or
  is in another language than the question (a quote that shares fewer, as for a question the wiki does not
  answer, leaves "not found" standing; one that shares two, or one that passed the extractive answerer's own
  cross-lingual test, is what the product would show without a model);
- or it leaves out the answering unit: of the quote's units (sentences or table rows), those that share the
  most of the question's content words are all left out. A unit is left out where the reply misses one of
  its numbers or identifiers ("PCR18", "4.3.3") if it has one to three, or else keeps fewer than half of
  its content words the question does not have (a table row's cell values: its numbering and headers
  aside). The other units may be condensed away: a quote often adds a near-equally relevant unit that does
  not answer. Qwen2.5-0.5B rewrote "PCR18 - Trusted OS start-up code (MLE)" as "The Trusted OS start-up
  code is responsible for MLE", or answered from another source without citing it; on 45 dev turns per
  language its answers missed the gold in 10 turns where the quote had it (BENCHMARKS.md, "Answers that
  keep the answering unit"). Two rewrites are exempt, as neither can be compared word for word: one that
  cites a source the quote does not (a correction from the sources), and one in another language than the
  quote (a German answer over an English wiki).

Then the quote is the answer, as it would be without a model; any other rewrite is kept.
"""

from __future__ import annotations

import re

from pipeline.answer.citations import cited_numbers, is_out_of_scope, strip_markers
from pipeline.answer.extractive import Terms, text_language

MIN_SHARED_TERMS = 2  # content words of the question a quote must share to outweigh "not found"
MIN_KEPT_SHARE = 0.5  # of a quoted unit's own content words, what a rewrite must keep
MAX_CHECKED_IDS = 3  # a unit with one to this many numbers or identifiers is kept when they all are
_ROW = re.compile(r"^Row \d+ in Table \d+:\s*")  # a verbalized table row (``pipeline.ingest.evidence``)
_UNIT = re.compile(r"\S.*?(?:\s*\[Source \d+\])+\.?", re.DOTALL)  # "fact [Source 1]." as the draft cites


def keeps_draft(answer: str, question: str, draft: str) -> bool:
    """Whether ``draft`` should be shown instead of the model's ``answer`` (see module docstring)."""
    if not draft.strip():
        return False
    terms = Terms()
    asked = terms(strip_markers(question))
    quoted = terms(strip_markers(draft))
    if not answer.strip() or is_out_of_scope(answer):
        # "not found" stands unless the quote matches two of the question's content words (all, if fewer), or
        # is in another language, where shared words say nothing and the quote's own test decided
        asked_in, quoted_in = text_language(question), text_language(draft)
        if asked_in and quoted_in and asked_in != quoted_in:
            return True
        return bool(asked) and len(asked & quoted) >= min(MIN_SHARED_TERMS, len(asked))
    said = terms(strip_markers(answer))
    restated = not (said - asked) and 2 * len(said & asked) >= len(asked)  # half the question, nothing else
    if not cited_numbers(answer) <= cited_numbers(draft):
        return False  # cites another source: a correction
    return (restated and bool(quoted - asked)) or drops_the_answering_unit(answer, asked, draft, terms)


def drops_the_answering_unit(answer: str, asked: set[str], draft: str, terms: Terms) -> bool:
    """Whether ``answer`` leaves out every quoted unit of ``draft`` that shares the most of the question's
    content words ``asked`` (see module docstring)."""
    said_in, quoted_in = text_language(answer), text_language(draft)
    if said_in and quoted_in and said_in != quoted_in:
        return False
    said = terms(strip_markers(answer))
    quoted = [strip_markers(u) for u in _UNIT.findall(draft)]
    units = [(terms(u), own) for u in quoted if (own := terms(_content(u)) - asked)]
    if not units:
        return False
    most = max(len(words & asked) for words, _ in units)
    return all(_left_out(own, said) for words, own in units if len(words & asked) == most)


def _left_out(own: set[str], said: set[str]) -> bool:
    """A unit whose own content words are ``own`` is left out of an answer saying ``said``."""
    ids = {w for w in own if any(ch.isdigit() for ch in w)}
    if 0 < len(ids) <= MAX_CHECKED_IDS:  # "PCR18 [Source 1]" keeps "PCR18 - Trusted OS start-up code"
        return bool(ids - said)
    return len(own & said) < MIN_KEPT_SHARE * len(own)


def _content(unit: str) -> str:
    """A unit's words; a verbalized row's cell values only ("Row 2 in Table 1: Step is syncui, and ..." ->
    "syncui ..."), as its numbering and headers are no fact a rewrite must repeat."""
    if not _ROW.match(unit):
        return unit
    return " ".join(cell.split(" is ", 1)[-1] for cell in _ROW.sub("", unit).split(", and "))
