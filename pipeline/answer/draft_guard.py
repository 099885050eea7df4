"""The ``draft`` style's guard: a model's answer never says less than the quote it was given to rewrite.

With the ``draft`` prompt the model starts from the extractive answer's quote. A small model sometimes drops
it: Qwen2.5-0.5B in German restated the question or replied that the sources hold no answer where the quote
had it (the answer contained the gold in 0.120 of the dev turns against 0.240 for the quote alone;
BENCHMARKS.md, "Answers written from an extractive draft"). Three shapes are recognisable without a judge:

- the reply restates the question: it has no content word (stemmed, stop words and citation markers aside)
  the question does not, it has at least half of the question's, and it cites no source the quote does not,
  while the quote adds words of its own (so "Frankfurt [Source 2]" to "Frankfurt or Berlin?" stands, and so
  does a restatement that cites another source than the quote);
- or it is empty or the out-of-scope sentence while the quote shares two of the question's content words (a
  quote that shares fewer, as for a question the wiki does not answer, leaves "not found" standing; one that
  shares two is what the product would show without a model), or is in another language than the question
  (a German question over an English wiki: no word can match, and the quote was chosen by meaning;
  Qwen2.5-0.5B said "not found" to "Und wenn ich nur die Regeln löschen möchte?" over the quoted
  "clear_rules" row);
- or it leaves out the answering unit: of the quote's units (sentences or table rows), those that share the
  most of the question's content words are all left out. A unit with one to three numbers is left out where
  the reply has fewer than half of them ("18" of "PCR18"; "4.3.3", "10,000" as "10000", "02:00" as "2:00";
  citation markers aside, and a number the question gives counts as said); any other unit where the reply has
  none of its content words the question does not have (a table row's cell values: its numbering and headers
  aside). The other units may be condensed away, as a quote often adds a near-equally relevant unit that does
  not answer, and a concise answer with one of the unit's words or half its numbers stands. Qwen2.5-0.5B
  rewrote "PCR18 - Trusted OS start-up code (MLE)" as "The Trusted OS start-up code is responsible for MLE",
  or answered another question; BENCHMARKS.md, "Answers that keep the answering unit". Exempt, as none can be
  compared word for word with the quote: a reply that cites a source the quote does not, states a number
  the quote does not that a sentence of the sources sharing a word with the question has, or whose every
  content word that neither the question nor the quote has is in one sentence or table row sharing more of
  the question's words than any quoted unit ("Type Enforcement" where the quote picked a sentence about
  something else; corrections from the sources); one in another language than the quote (a German answer
  over an English wiki); and "yes" or "no" with none but the question's words, or one of the question's
  options that a quoted unit names. Paraphrases with synonyms only are not recognised: the quote is shown.

Then the quote is the answer, as it would be without a model; any other rewrite is kept.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from pipeline.answer.budget import split_units
from pipeline.answer.citations import (
    WORD_JOINER,
    cited_numbers,
    is_out_of_scope,
    source_numbers,
    strip_markers,
)
from pipeline.answer.extractive import Terms, text_language

MIN_SHARED_TERMS = 2  # content words of the question a quote must share to outweigh "not found"
MAX_CHECKED_NUMBERS = 3  # a unit with one to this many numbers is kept where the answer has half of them
_ROW = re.compile(r"^Row \d+ in Table \d+:\s*")  # a verbalized table row (``pipeline.ingest.evidence``)
_UNIT = re.compile(r"\S.*?(?:\s*\[Source \d+\])+\.?", re.DOTALL)  # "fact [Source 1]." as the draft cites
_NUMBER = re.compile(r"\d+(?:[.,:-]\d+)*")  # "18" of "PCR18", "4.3.3", "10,000", "02:00", "555-0100"
_THOUSANDS_NUMBER = re.compile(r"\d{1,3}(?:,\d{3})+")
_WRITTEN = re.compile(rf"[\[(]{WORD_JOINER}[^\])]*[\])]")  # "[\u20603]": page text (``citations.as_written``)
_YES_NO = frozenset({"yes", "no", "ja", "nein"})
_NOT = frozenset({"not", "nicht", "kein", "keine"})
_LEADING_ZEROS = re.compile(r"^0+(?=\d)")
_LIST_NUMBER = re.compile(r"(?:^|[.:;]\s+|\n\s*)(\d{1,2})[.)]\s")  # "1. Hold …", "… [Source 1]. 2. Log …"


def keeps_draft(answer: str, question: str, draft: str, sources: Sequence[str] = ()) -> bool:
    """Whether ``draft`` should be shown instead of the model's ``answer`` to ``question``, written from
    ``sources`` (see module docstring)."""
    if not draft.strip():
        return False
    terms = Terms()
    asked = terms(strip_markers(question))
    quoted = terms(strip_markers(draft))
    if not answer.strip() or is_out_of_scope(answer):
        # "not found" stands unless the quote matches two of the question's content words (all, if fewer),
        # or is in another language than the question: then no word can match, and the quote was chosen by
        # meaning, as quoting shows it
        if _other_language(question, draft):
            return True
        return bool(asked) and len(asked & quoted) >= min(MIN_SHARED_TERMS, len(asked))
    if not source_numbers(answer, sources) <= cited_numbers(draft):
        return False  # cites another source: a correction ("regs[0]" copied from a source is no citation)
    said = terms(strip_markers(answer))
    restated = not (said - asked) and 2 * len(said & asked) >= len(asked)  # half the question, nothing else
    if restated:
        return bool(quoted - asked)
    return _leaves_out_the_answer(answer, said, (asked, numbers_in(question)), draft, sources, terms)


def _leaves_out_the_answer(answer: str, said: set[str], question: tuple[set[str], set[str]], draft: str,
                           sources: Sequence[str], terms: Terms) -> bool:
    """Whether ``answer`` (content words ``said``) leaves out every quoted unit of ``draft`` that shares the
    most of the question's content words (``question``: those and its numbers; see module docstring)."""
    asked, given = question
    units = [strip_markers(u) for u in draft_units(draft)]
    if not units:
        return False
    said_in, quoted_in = text_language(answer), text_language(" ".join(unit_content(u) for u in units))
    if said_in and quoted_in and said_in != quoted_in:
        return False  # another language: not comparable word for word
    words = [terms(u) for u in units]
    plain = said - _YES_NO - _NOT
    if plain <= asked and (said & _YES_NO or (plain and any(plain <= w for w in words))):
        return False  # yes or no with the question's words, or one of its options that the quote names
    numbers = numbers_in(strip_markers(answer))
    if _corrects_from_sources((said, _stated(answer, given)), asked, (units, words), sources, terms):
        return False
    overlap = [len(w & asked) for w in words]
    most = max(overlap)
    answering = [u for u, n in zip(units, overlap, strict=True) if n == most]
    return all(_left_out(unit_content(u), said, numbers | given, asked, terms) for u in answering)


def corrects(answer: str, question: str, draft: str, sources: Sequence[str] = ()) -> bool:
    """Whether ``answer`` corrects its ``draft`` from the ``sources``, as the guard takes a correction: it
    cites a source the draft does not, or states a number or words the draft does not that the sources have
    where they answer the question (see module docstring); a number the question gives or a list's
    numbering is none. Quoting the draft beneath it would contradict it (``draft_quotes``)."""
    if not source_numbers(answer, sources) <= cited_numbers(draft):
        return True
    units = [strip_markers(u) for u in draft_units(draft)]
    if not units:
        return False
    terms = Terms()
    return _corrects_from_sources((terms(strip_markers(answer)), _stated(answer, numbers_in(question))),
                                  terms(strip_markers(question)), (units, [terms(u) for u in units]), sources,
                                  terms)


def _stated(answer: str, given: set[str]) -> set[str]:
    """The numbers an answer states of its own: not those the question ``given``, nor a list's numbering."""
    plain = strip_markers(answer)
    return numbers_in(plain) - given - set(_LIST_NUMBER.findall(plain))


def _corrects_from_sources(said: tuple[set[str], set[str]], asked: set[str],
                           quoted: tuple[Sequence[str], Sequence[set[str]]], sources: Sequence[str],
                           terms: Terms) -> bool:
    """An answer's content words and numbers (``said``) correct its quoted units (``quoted``: their texts and
    words) from the ``sources``: a number (``_corrects_a_number``) or words (``_corrects_in_words``)."""
    words, numbers = said
    units, unit_words = quoted
    if _corrects_a_number(numbers - numbers_in(" ".join(units)), asked, sources, terms):
        return True
    most = max(len(w & asked) for w in unit_words)
    return _corrects_in_words(words - asked - set().union(*unit_words), (asked, most), sources, terms)


def _left_out(unit: str, said: set[str], numbers: set[str], asked: set[str], terms: Terms) -> bool:
    """Whether an answer with content words ``said`` and ``numbers`` (the question's included) leaves
    ``unit`` out: it has under half of the unit's numbers (where it has one to three), or else none of its
    content words the question does not have (``asked``)."""
    own_numbers = numbers_in(unit)
    if 0 < len(own_numbers) <= MAX_CHECKED_NUMBERS:  # "PCR18 [Source 1]" keeps "PCR18 - Trusted OS start-up"
        return 2 * len(own_numbers & numbers) < len(own_numbers)  # "On 12 November" keeps "12 November 2024"
    own = terms(unit) - asked
    return bool(own) and not own & said


def _corrects_in_words(new: set[str], question: tuple[set[str], int], sources: Sequence[str],
                       terms: Terms) -> bool:
    """Whether every content word ``new`` to an answer (neither the question's nor its quote's) is in one
    sentence or table row of the ``sources`` that shares more of the question's content words than any
    quoted unit does (``question``: those words and that most): a correction. Sharing only the page's topic
    word is not enough, or any word of the page would pass ("It is based on the kernel")."""
    asked, most = question
    if not new:
        return False
    return any(new <= words and len(words & asked) > most
               for words in (terms(unit) for source in sources for unit in split_units(source)))


def _corrects_a_number(stated: set[str], asked: set[str], sources: Sequence[str], terms: Terms) -> bool:
    """Whether one of the numbers an answer ``stated`` (and its quote does not) is in a sentence or table row
    of the ``sources`` that shares a content word with the question: a correction from the sources."""
    if not stated:
        return False
    return any(stated & numbers_in(unit) and terms(unit) & asked
               for source in sources for unit in split_units(source))


def _other_language(question: str, draft: str) -> bool:
    """Whether the question and the draft's quoted words are in two languages (both recognised)."""
    asked = text_language(strip_markers(question))
    quoted = text_language(" ".join(unit_content(strip_markers(u)) for u in draft_units(draft)))
    return asked is not None and quoted is not None and asked != quoted


def draft_units(draft: str) -> list[str]:
    """The quoted units of a draft, each with its markers: "fact [Source 1]." as the draft cites it."""
    return _UNIT.findall(draft)


def numbers_in(text: str) -> set[str]:
    """The numbers in ``text``: thousands separators and leading zeros dropped ("10,000" as "10000", "02:00"
    as "2:00"); "1,5" stays a decimal."""
    found = (n.replace(",", "") if _THOUSANDS_NUMBER.fullmatch(n) else n for n in _NUMBER.findall(text))
    return {_LEADING_ZEROS.sub("", n) for n in found}


def unit_content(unit: str) -> str:
    """A unit's words; a verbalized row's cell values only ("Row 2 in Table 1: Step is syncui, and ..." ->
    "syncui ..."), as its numbering and headers are no fact a rewrite must repeat; marker-like page text
    ("note [3]", "(Source 2)", kept as written) aside, as no rewrite repeats a footnote mark."""
    unit = _WRITTEN.sub("", unit)
    if not _ROW.match(unit):
        return unit
    return " ".join(cell.split(" is ", 1)[-1] for cell in _ROW.sub("", unit).split(", and "))
