"""Turn the generator's source markers into per-page citations the user can click.

The generator cites numbered evidence (``[Source 3]``); users want pages. Markers are mapped to the
evidence they name, grouped by page url, and renumbered ``[1]``, ``[2]``... in order of first appearance;
markers naming no shown source (hallucinated numbers) are removed from the text.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from pipeline.answer.prompts import OUT_OF_SCOPE
from pipeline.types import Citation, Hit

# One bracketed marker: [3], [Source 3], [Sources 1, 2], [1, 3], [Source 1 and Source 4], [1; 2].
_NUM_LIST = r"(?:sources?\s*)?\d+(?:\s*(?:,|;|&|and|und)\s*(?:sources?\s*)?\d+)*"
_NUM_LIST_WORD = r"sources?\s*\d+(?:\s*(?:,|;|&|and|und)\s*(?:sources?\s*)?\d+)*"
# ... or a parenthesised one that names the word: (Source 2), (Sources 1, 3).
_MARKER = rf"(?:\[\s*{_NUM_LIST}\s*\]|\(\s*{_NUM_LIST_WORD}\s*\))"
# A run of adjacent markers, e.g. "[1][3]" or "[Source 1] [Source 2]", with the whitespace before it.
_GROUP = re.compile(rf"([ \t]*)({_MARKER}(?:[ \t]*{_MARKER})*)", re.IGNORECASE)
_MARKER_RE = re.compile(_MARKER, re.IGNORECASE)
_DIGITS = re.compile(r"\d+")


def _page_key(hit: Hit) -> str:
    return hit.evidence.url or hit.evidence.page_id


def parse_citations(answer_text: str, sources: Sequence[Hit]) -> tuple[str, list[Citation]]:
    """Rewrite markers to page numbers ``[k]`` and return (clean text, citations in number order)."""
    page_number: dict[str, int] = {}
    citations: dict[str, dict[str, object]] = {}

    def cite(n: int) -> int | None:
        if not 1 <= n <= len(sources):
            return None
        hit = sources[n - 1]
        key = _page_key(hit)
        if key not in page_number:
            page_number[key] = len(page_number) + 1
            citations[key] = {"hit": hit, "ids": []}
        ids = citations[key]["ids"]
        assert isinstance(ids, list)
        if hit.evidence.id not in ids:
            ids.append(hit.evidence.id)
        return page_number[key]

    def rewrite(m: re.Match[str]) -> str:
        numbers: list[int] = []
        for marker in _MARKER_RE.findall(m.group(2)):
            for d in _DIGITS.findall(marker):
                k = cite(int(d))
                if k is not None and k not in numbers:
                    numbers.append(k)
        if not numbers:
            return ""
        return m.group(1) + "".join(f"[{k}]" for k in numbers)

    text = _GROUP.sub(rewrite, answer_text).strip()
    out: list[Citation] = []
    for key, number in page_number.items():
        hit = citations[key]["hit"]
        ids = citations[key]["ids"]
        assert isinstance(hit, Hit) and isinstance(ids, list)
        ev = hit.evidence
        out.append(Citation(number=number, url=ev.url, title=ev.title, space=ev.space, evidence_ids=tuple(ids)))
    return text, out


_NORMALISE = re.compile(r"[^\w]+")


def _norm(text: str) -> str:
    return _NORMALISE.sub(" ", _MARKER_RE.sub(" ", text).lower()).strip()


def is_out_of_scope(text: str) -> bool:
    """True when the answer is the fallback sentence, ignoring case, punctuation, quotes and markers."""
    return bool(text) and _norm(text) == _norm(OUT_OF_SCOPE)
