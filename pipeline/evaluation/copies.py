"""Pages that are copies of each other, for a copy-aware Precision@1.

Real wikis hold copies: a team page copied into a personal space, a page moved by copying. ConfQuestions has
five such pairs (``Tech1: OpenXT Platform Architecture`` in space CS and in ``~cclark``, word 5-shingle
Jaccard 0.97-1.0), and its gold URL names whichever copy the annotator had open (Tech1: 4 questions name one
copy, 5 the other). Under the paper's page-URL rule a system that ranks the other copy first scores a miss on
a coin flip. The copy-aware figure counts a hit on a page whose text is a near-copy of the gold page's
(Jaccard of word 5-shingles ≥ ``THRESHOLD``); it is reported next to the paper's rule, never instead of it.
"""

from __future__ import annotations

import re
import zlib
from collections import defaultdict
from collections.abc import AsyncIterable, Iterable

from pipeline.evaluation.metrics import normalize_url
from pipeline.types import Page

THRESHOLD = 0.9
SHINGLE = 5
SKETCH = 16  # bottom-k sketch size: pages share a candidate bucket when they share one of these hashes

_TAG = re.compile(r"<[^>]+>")
_WORD = re.compile(r"\w+")


def shingles(body: str) -> frozenset[int]:
    """Hashes of the word 5-shingles of a page's text (markup removed, lowercased)."""
    words = _WORD.findall(_TAG.sub(" ", body).lower())
    n = max(1, len(words) - SHINGLE + 1) if words else 0
    return frozenset(zlib.crc32(" ".join(words[i:i + SHINGLE]).encode("utf-8")) for i in range(n))


def jaccard(a: frozenset[int], b: frozenset[int]) -> float:
    return len(a & b) / len(a | b) if a and b else 0.0


def copy_groups(pages: Iterable[tuple[str, frozenset[int]]], *,
                threshold: float = THRESHOLD) -> dict[str, frozenset[str]]:
    """For each key whose text has near-copies: the keys of those copies (itself excluded).

    Candidates come from bottom-``SKETCH`` sketches (two sets with Jaccard ≥ 0.9 share most of their smallest
    hashes), so the cost grows with the number of pages, not with its square; each candidate pair is then
    compared exactly."""
    sets = dict(pages)
    buckets: dict[int, list[str]] = defaultdict(list)
    for key, sh in sets.items():
        for h in sorted(sh)[:SKETCH]:
            buckets[h].append(key)
    out: dict[str, set[str]] = defaultdict(set)
    seen: set[tuple[str, str]] = set()
    for keys in buckets.values():
        for i, a in enumerate(keys):
            for b in keys[i + 1:]:
                pair = (a, b) if a < b else (b, a)
                if pair in seen:
                    continue
                seen.add(pair)
                if jaccard(sets[a], sets[b]) >= threshold:
                    out[a].add(b)
                    out[b].add(a)
    return {k: frozenset(v) for k, v in out.items()}


async def page_copies(
    pages: AsyncIterable[Page], *, threshold: float = THRESHOLD
) -> dict[str, frozenset[str]]:
    """Copy groups of a page source, keyed by normalized page URL (``metrics.normalize_url``)."""
    items = [(normalize_url(p.url), shingles(p.body)) async for p in pages]
    return copy_groups(items, threshold=threshold)


def with_copies(gold: Iterable[str], copies: dict[str, frozenset[str]]) -> list[str]:
    """The gold URLs and the normalized URLs of their copies."""
    out = list(gold)
    for g in list(out):
        out.extend(sorted(copies.get(normalize_url(g), ())))
    return out
