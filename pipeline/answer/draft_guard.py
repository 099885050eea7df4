"""The ``draft`` style's guard: a model's answer never says less than the quote it was given to rewrite.

With the ``draft`` prompt the model starts from the extractive answer's quote. A small model sometimes drops
it: Qwen2.5-0.5B in German restated the question or replied that the sources hold no answer where the quote
had it (the answer contained the gold in 0.120 of the dev turns against 0.240 for the quote alone;
BENCHMARKS.md, "Answers written from an extractive draft"). Both are recognisable without a judge:

- the reply restates the question: it has no content word (stemmed, stop words and citation markers aside)
  the question does not, it has at least half of the question's, and it cites no source the quote does not,
  while the quote adds words of its own (so "Frankfurt [Source 1]" to "Frankfurt or Berlin?" stands, and so
  does a restatement that cites another source than the quote);
- or it is empty or the out-of-scope sentence while the quote shares two of the question's content words (a
  quote that shares fewer, as for a question the wiki does not answer, leaves "not found" standing; one that
  shares two is what the product would show without a model).

Then the quote is the answer, as it would be without a model; any other rewrite, including one that corrects
the quote from the sources, is kept.
"""

from __future__ import annotations

from pipeline.answer.citations import cited_numbers, is_out_of_scope, strip_markers
from pipeline.answer.extractive import Terms

MIN_SHARED_TERMS = 2  # content words of the question a quote must share to outweigh "not found"


def keeps_draft(answer: str, question: str, draft: str) -> bool:
    """Whether ``draft`` should be shown instead of the model's ``answer`` (see module docstring)."""
    if not draft.strip():
        return False
    terms = Terms()
    asked = terms(strip_markers(question))
    quoted = terms(strip_markers(draft))
    if not answer.strip() or is_out_of_scope(answer):
        # "not found" stands unless the quote matches two of the question's content words (all, if fewer)
        return bool(asked) and len(asked & quoted) >= min(MIN_SHARED_TERMS, len(asked))
    said = terms(strip_markers(answer))
    restated = not (said - asked) and 2 * len(said & asked) >= len(asked)  # half the question, nothing else
    return restated and bool(quoted - asked) and cited_numbers(answer) <= cited_numbers(draft)
