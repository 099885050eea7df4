"""Fit ranked evidence into the LLM's context budget.

Higher-ranked evidence is kept first; when the budget runs out, lower-ranked evidence is dropped, and an
item too large for what is left is cut only at a row or sentence boundary, never inside a table row or a
sentence, so the generator never sees half a fact. Token counts default to a conservative character
estimate because a real tokenizer would have to download its vocabulary at run time.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

CHARS_PER_TOKEN = 3.5

# A sentence ends at . ! ? (optionally closed by quotes/brackets) followed by space and an upper-case
# letter, digit or opening quote/bracket: "e.g. the" or "v1.2" are not boundaries.
_SENTENCE_END = re.compile(r"(?<=[.!?])[\"')\]]*\s+(?=[\"'(\[]?[A-ZÄÖÜ0-9])")


def estimate_tokens(text: str) -> int:
    """ceil(chars / 3.5): over-counts English for BPE tokenizers, so the budget errs on the safe side."""
    return math.ceil(len(text) / CHARS_PER_TOKEN)


@dataclass
class BudgetResult:
    kept: list[tuple[str, str]] = field(default_factory=list)  # (evidence_id, text), rank order
    dropped: list[str] = field(default_factory=list)
    truncated: list[str] = field(default_factory=list)  # ids in ``kept`` whose text was shortened


def split_units(text: str) -> list[str]:
    """Split evidence into atomic pieces whose concatenation is ``text``: each line is a unit when it is a
    table row ("Row ..." or a "|"-separated line); other lines are split into sentences."""
    units: list[str] = []
    for line in text.splitlines(keepends=True):
        body = line.strip()
        if body.startswith("Row ") or "|" in body or not body:
            units.append(line)
            continue
        start = 0
        for m in _SENTENCE_END.finditer(line):
            units.append(line[start:m.end()])
            start = m.end()
        units.append(line[start:])
    return [u for u in units if u]


def truncate_at_boundary(text: str, budget_tokens: int, count_tokens: Callable[[str], int]) -> str:
    """The longest prefix of whole units (rows/sentences) that fits ``budget_tokens``; "" if none does."""
    units = split_units(text)
    lo, hi = 0, len(units)  # invariant: prefix of lo units fits; binary search on the prefix length
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if count_tokens("".join(units[:mid]).rstrip()) <= budget_tokens:
            lo = mid
        else:
            hi = mid - 1
    return "".join(units[:lo]).rstrip()


def fit_evidence(
    items: Sequence[tuple[str, str]],
    *,
    budget_tokens: int,
    count_tokens: Callable[[str], int] = estimate_tokens,
    per_item_overhead: int = 0,
) -> BudgetResult:
    """Keep ``(evidence_id, text)`` items in rank order within ``budget_tokens``.

    ``per_item_overhead`` accounts for the "Source n: " label and separators the prompt adds per item.
    Once one item had to be truncated or dropped, every lower-ranked item is dropped as well, so a kept
    item never outranks a dropped one.
    """
    result = BudgetResult()
    remaining = budget_tokens
    full = False
    for evidence_id, text in items:
        if full:
            result.dropped.append(evidence_id)
            continue
        available = remaining - per_item_overhead
        cost = count_tokens(text)
        if cost <= available:
            result.kept.append((evidence_id, text))
            remaining -= cost + per_item_overhead
            continue
        full = True
        cut = truncate_at_boundary(text, available, count_tokens) if available > 0 else ""
        if cut:
            result.kept.append((evidence_id, cut))
            result.truncated.append(evidence_id)
        else:
            result.dropped.append(evidence_id)
    return result
