"""Turn the generator's source markers into per-page citations the user can click.

The generator cites numbered evidence (``[Source 3]``); users want pages. Markers are mapped to the
evidence they name, grouped by page url, and renumbered ``[1]``, ``[2]``... in order of first appearance;
markers naming no shown source (hallucinated numbers) are removed from the text. Bracketed numbers that are
page text ("see note [3]", "regs[0]": quoted by the extractive answerer, or copied by a model after the same
word as in a source) stay as written, with an invisible word joiner after the bracket (``as_written``).
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Sequence

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
_SOURCE_WORD = re.compile(r"source", re.IGNORECASE)
_LAST_WORD = re.compile(r"\w+\Z")  # the word before a marker run (``_GROUP`` takes the blanks)
_DIGITS = re.compile(r"\d+")
TextSink = Callable[[str], Awaitable[None]]


def _page_key(hit: Hit) -> str:
    return hit.evidence.url or hit.evidence.page_id


class PageNumbers:
    """Source numbers (1-based, as the generator saw them) to page numbers in order of first citation."""

    def __init__(self, sources: Sequence[Hit]) -> None:
        self.sources = sources
        self.page_number: dict[str, int] = {}
        self.cited: dict[str, tuple[Hit, list[str]]] = {}
        self._texts = "\n".join(h.evidence.text for h in sources)

    def rewrite_text(self, text: str, before: str = "") -> str:
        """Every marker run of ``text`` rewritten (``rewrite``), except page text the answer copied: a bare
        number ("[3]", no "Source") that the sources have right after the same word ("see note [3]",
        "regs[0]") stays as written. ``before`` is the text preceding ``text`` (a stream's earlier pieces)."""

        def repl(m: re.Match[str]) -> str:
            cut = _copied_prefix(self._texts, before + text[: m.start()], m.group(2))
            if not cut:
                return self.rewrite(m)
            rest = _GROUP.sub(self.rewrite, m.group(2)[cut:])
            return m.group(1) + as_written(m.group(2)[:cut]) + rest

        return _GROUP.sub(repl, text)

    def cite(self, n: int) -> int | None:
        if not 1 <= n <= len(self.sources):
            return None
        hit = self.sources[n - 1]
        key = _page_key(hit)
        if key not in self.page_number:
            self.page_number[key] = len(self.page_number) + 1
            self.cited[key] = (hit, [])
        ids = self.cited[key][1]
        if hit.evidence.id not in ids:
            ids.append(hit.evidence.id)
        return self.page_number[key]

    def rewrite(self, m: re.Match[str]) -> str:
        """A run of markers as ``[k]`` page markers; "" when it names no shown source."""
        numbers: list[int] = []
        for marker in _MARKER_RE.findall(m.group(2)):
            for d in _DIGITS.findall(marker):
                k = self.cite(int(d))
                if k is not None and k not in numbers:
                    numbers.append(k)
        if not numbers:
            return ""
        return m.group(1) + "".join(f"[{k}]" for k in numbers)

    def citations(self) -> list[Citation]:
        out: list[Citation] = []
        for key, number in self.page_number.items():
            hit, ids = self.cited[key]
            ev = hit.evidence
            out.append(
                Citation(number=number, url=ev.url, title=ev.title, space=ev.space, evidence_ids=tuple(ids))
            )
        return out


def _copied_prefix(texts: str, preceding: str, run: str) -> int:
    """How much of the marker ``run`` (its leading bare numbers) ``texts`` have right after the word that ends
    ``preceding``, as a whole word: page text an answer copied; 0 for none."""
    word = _LAST_WORD.search(preceding[-MAX_MARKER_CHARS:])
    cut = 0
    if word is None:
        return 0
    for marker in _MARKER_RE.finditer(run):
        if _SOURCE_WORD.search(marker.group(0)):
            break
        copied = r"(?<!\w)" + re.escape(word.group(0)) + r"[ \t]*" + re.escape(run[: marker.end()])
        if re.search(copied, texts, re.IGNORECASE) is None:
            break
        cut = marker.end()
    return cut


def source_numbers(text: str, texts: Sequence[str]) -> set[int]:
    """The source numbers ``text``'s markers name, bracketed numbers it copied from ``texts`` (the sources'
    texts) aside: ``cited_numbers`` as ``parse_citations`` reads them."""
    joined = "\n".join(texts)
    found: set[int] = set()
    for m in _GROUP.finditer(text):
        cut = _copied_prefix(joined, text[: m.start()], m.group(2))
        found |= cited_numbers(m.group(2)[cut:])
    return found


def parse_citations(answer_text: str, sources: Sequence[Hit]) -> tuple[str, list[Citation]]:
    """Rewrite markers to page numbers ``[k]`` and return (clean text, citations in number order)."""
    numbers = PageNumbers(sources)
    text = numbers.rewrite_text(answer_text).strip()
    return text, numbers.citations()


WORD_JOINER = "\u2060"  # invisible: "[\u20603]" reads as "[3]" and is no marker


def as_written(text: str) -> str:
    """``text`` whose marker-like sequences ("see note [3]", "array[0]") are quoted page text, not
    citations: an invisible word joiner after the bracket keeps ``parse_citations`` off them."""
    return _MARKER_RE.sub(lambda m: m.group(0)[0] + WORD_JOINER + m.group(0)[1:], text)


def strip_markers(text: str) -> str:
    """``text`` without its source markers (and the blanks before them)."""
    return _GROUP.sub("", text).strip()


def cited_numbers(text: str) -> set[int]:
    """The source numbers ``text``'s markers name (``[Source 2]``, ``[1, 3]``, ``(Sources 1 and 4)``...)."""
    return {int(n) for marker in _MARKER_RE.findall(text) for n in _DIGITS.findall(marker)}


MAX_MARKER_CHARS = 60  # held text longer than this is not a marker in the making: it is let through
_OPEN_TAIL = re.compile(r"[ \t]*[\[(][\sA-Za-z0-9,;&]*\Z")  # "[", "[Sour", "[Source 1, ", "(Sources 2 and"
_RUN_TAIL = re.compile(rf"[ \t]*{_MARKER}(?:[ \t]*{_MARKER})*[ \t]*\Z", re.IGNORECASE)
_BLANK_TAIL = re.compile(r"[ \t]+\Z")  # blanks before a marker go with it when it names no source


class CitingStream:
    """Streamed answer text with the page markers ``parse_citations`` gives the final answer (``[Source 3]``
    -> ``[1]``, numbers in order of first citation, unknown sources dropped). A marker run still open at the
    end of a piece (an unclosed ``[`` or ``(``, or markers that the next piece may continue) is held back
    until it is complete, so a run split across pieces is rewritten whole; ``flush`` lets the rest out."""

    def __init__(self, sources: Sequence[Hit], sink: TextSink) -> None:
        self.numbers = PageNumbers(sources)
        self.sink = sink
        self._held = ""
        self._before = ""  # the end of the text emitted so far: the word before a marker run

    async def add(self, piece: str) -> None:
        buffer = self._held + piece
        cut = len(buffer)
        for tail in (_BLANK_TAIL, _OPEN_TAIL, _RUN_TAIL):
            m = tail.search(buffer[:cut])
            if m and len(buffer) - m.start() <= MAX_MARKER_CHARS:
                cut = m.start()
        self._held = buffer[cut:]
        await self._emit(buffer[:cut])

    async def flush(self) -> None:
        held, self._held = self._held, ""
        await self._emit(held)

    async def _emit(self, text: str) -> None:
        out = self.numbers.rewrite_text(text, self._before) if text else ""
        self._before = (self._before + text)[-MAX_MARKER_CHARS:]
        if out:
            await self.sink(out)


_NORMALISE = re.compile(r"[^\w]+")


def _norm(text: str) -> str:
    return _NORMALISE.sub(" ", _MARKER_RE.sub(" ", text).lower()).strip()


MAX_LEAD_IN_WORDS = 3  # "No, the desired information cannot be found …" (Qwen2.5-0.5B), "Sorry, but …"


def is_out_of_scope(text: str) -> bool:
    """True when the answer is the fallback sentence, ignoring case, punctuation, quotes and markers, after
    at most ``MAX_LEAD_IN_WORDS`` words of lead-in."""
    said, fallback = _norm(text), _norm(OUT_OF_SCOPE)
    if not text or not said.endswith(fallback):
        return False
    lead_in = said[: len(said) - len(fallback)]
    if lead_in == "":
        return True
    # words only: a lead-in with a citation or a number is an answer ("PCR18 [Source 1]. The desired …")
    return (lead_in.endswith(" ") and len(lead_in.split()) <= MAX_LEAD_IN_WORDS
            and not _MARKER_RE.search(text) and not any(c.isdigit() for c in lead_in))
