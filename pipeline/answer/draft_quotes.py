"""The ``draft`` style's quotes beneath a rewrite: the quoted units a model's answer does not say are shown
under it, word for word, so that an answer written with a model says at least what quoting says.

Why: a small model rewrites the extractive answer's quote shorter and closer to the question (Qwen2.5-0.5B:
token F1 0.252 against 0.161 for the quote, 75 unseen dev turns in English), but its rewrite keeps only the
unit it found most relevant, and where the gold was in the quote's other unit ("Kevin Pearson - AFRL", then
Kevin's action item) the answer lost it: the rewrite contained the gold in 0.280 / 0.213 of the turns
against 0.307 / 0.227 for the quote alone (BENCHMARKS.md, "Answers written from an extractive draft"). The
draft guard (``draft_guard.py``) shows the quote *instead* of a rewrite that drops its answering unit; this
module keeps a rewrite that stands and adds the units it leaves out, quoted and cited as the draft cites
them, beneath it.

A unit counts as said when the rewrite has every number of the unit (the question's count as said) and
at least ``SAID_SHARE`` of its own content words: stemmed, without the question's words, stop words,
citation markers and a verbalized row's numbering and headers. A unit with no such words counts as said
where its numbers are. A rewrite in another language than the quote cannot be compared word for word: a
unit is said there only where it has no content word of its own and the rewrite has all of its numbers
(German answers over an English wiki: the quotes are what holds the wiki's own words). A rewrite that
corrects the draft, as the draft guard takes a correction (it cites a source the draft does not, or states a
number or words the draft does not that the sources have where they answer the question), gets nothing
beneath it: the draft's units would contradict it ("12 nodes" above a quoted "9 nodes").

Explanations regenerate the model's words above the quotes (``AnswerTrace.explained``): the quotes are the
sources' own words, each cited.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from pipeline.answer.citations import strip_markers
from pipeline.answer.draft_guard import corrects, draft_units, numbers_in, unit_content
from pipeline.answer.extractive import Terms, text_language

SAID_SHARE = 2 / 3  # of a unit's own content words a rewrite must have for the unit to count as said
_TRAILING_MARKERS = re.compile(r"^(?P<text>.*?)(?P<marks>(?:\s*\[Source \d+\])+)\s*\.?\s*$", re.DOTALL)
OPEN_QUOTE, CLOSE_QUOTE = "\u201c", "\u201d"


def left_out_units(answer: str, question: str, draft: str, sources: Sequence[str] = (), *,
                   share: float = SAID_SHARE) -> list[str]:
    """The units of ``draft`` (each "fact [Source n]." as the draft cites it) that ``answer``, written from
    ``sources``, does not say; ``[]`` where there is no draft, no answer to add to, or the answer cites a
    source the draft does not or otherwise corrects it from the sources, as the draft guard takes a
    correction (``draft_guard.corrects``): the quote beneath would contradict it."""
    units = draft_units(draft)
    if not units or not answer.strip() or corrects(answer, question, draft, sources):
        return []
    terms = Terms()
    asked = terms(strip_markers(question))
    plain = strip_markers(answer)
    said, numbers = terms(plain), numbers_in(plain) | numbers_in(question)
    same_language = _comparable(plain, [unit_content(strip_markers(u)) for u in units])
    out = []
    for unit in units:
        content = unit_content(strip_markers(unit))
        own = terms(content) - asked
        words_said = not own or (same_language and len(own & said) >= share * len(own))
        if not (numbers_in(content) <= numbers and words_said):
            out.append(unit)
    return out


def with_quotes(answer: str, units: Sequence[str]) -> str:
    """``answer`` with ``units`` beneath it, a paragraph each, in quotation marks before its markers:
    'fact [Source 2].' -> '“fact” [Source 2]'."""
    if not units:
        return answer
    lines = []
    for unit in units:
        match = _TRAILING_MARKERS.match(unit.strip())
        text, marks = (match["text"].strip(), match["marks"].strip()) if match else (unit.strip(), "")
        lines.append(f"{OPEN_QUOTE}{text}{CLOSE_QUOTE} {marks}".rstrip())
    return "\n\n".join([answer.rstrip(), *lines])  # a paragraph each: Teams' markdown joins single lines


def _comparable(answer: str, contents: Sequence[str]) -> bool:
    said_in, quoted_in = text_language(answer), text_language(" ".join(contents))
    return not (said_in and quoted_in and said_in != quoted_in)
