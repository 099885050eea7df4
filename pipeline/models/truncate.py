"""Cutting a text to what an embedding model reads, at a word boundary, without tokenizing all of it."""

from __future__ import annotations

import re
from collections.abc import Callable

_WORD_END = re.compile(r"\S+")
_CHARS_PER_TOKEN_GUESS = 4.0


def truncate_to_tokens(text: str, max_tokens: int, count: Callable[[str], int]) -> str:
    """Cut ``text`` at a word boundary (inside words over 24 chars) so ``count(result) <= max_tokens``.

    Tokenizing a long text is itself costly, so this guesses a character cut (about 4 characters
    per token), measures only that prefix, and rescales the guess a few times. Texts shorter than
    ``max_tokens`` characters are returned untouched without counting (a subword tokenizer never
    yields more pieces than characters, plus a handful of special tokens).
    """
    if max_tokens <= 0 or len(text) + 8 <= max_tokens:
        return text
    ends: list[int] = []
    for m in _WORD_END.finditer(text):
        if m.end() - m.start() > 24:  # very long "words" (hashes, URLs, glued tables) get inner cuts
            ends.extend(range(m.start() + 8, m.end(), 8))
        ends.append(m.end())
    if not ends:
        return ""

    def prefix(chars: float) -> str:
        limit = max(1, int(chars))
        # the longest prefix ending on a cut point within ``limit`` characters (at least one)
        lo, hi = 0, len(ends) - 1
        best = 0
        while lo <= hi:
            mid = (lo + hi) // 2
            if ends[mid] <= limit:
                best, lo = mid, mid + 1
            else:
                hi = mid - 1
        return text[: ends[best]]

    guess = max_tokens * _CHARS_PER_TOKEN_GUESS
    best_fit = ""
    for _ in range(5):
        candidate = prefix(guess)
        n = count(candidate)
        if n <= max_tokens:
            if len(candidate) > len(best_fit):
                best_fit = candidate
            if candidate == text[: ends[-1]] or n >= 0.9 * max_tokens:
                break
            guess = len(candidate) * max_tokens / max(n, 1) * 0.97
        else:
            guess = len(candidate) * max_tokens / n * 0.95
    if best_fit:
        return best_fit
    # nothing measured fitted within the rescaling budget: a hard character cut always fits
    return text[: max(1, max_tokens - 8)]
