"""How sure retrieval is, from whether its two rankers agree, and what follows from it.

The hybrid index fuses a lexical (BM25) and a dense (e5) ranking. When both put the fused top page first, the
top page is right for 95–97 % of ConfQuestions dev questions; when neither does, for 14–26 % (split by
conversations, BENCHMARKS.md). That agreement is the confidence:

- ``high``: both rankers' first evidence is on the fused first page;
- ``medium``: one of them;
- ``low``: neither.

It needs no calibration constant that could overfit a split. Two uses: with ``high`` confidence the generator
gets only the first ``confident_k`` evidence (fewer prompt tokens, less distraction), and a ``low`` answer
carries a short certainty note that every surface shows under it (``bot.core.messages.certainty_note``, and
``evident ask``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from pipeline.types import Hit

Confidence = Literal["high", "medium", "low"]


def confidence_of(fused: Sequence[Hit], lexical_top: Hit | None, dense_top: Hit | None) -> Confidence | None:
    """The agreement of the rankers' first evidence with the fused first page (None without hits)."""
    if not fused:
        return None
    page = fused[0].evidence.page_id
    agree = sum(1 for top in (lexical_top, dense_top) if top is not None and top.evidence.page_id == page)
    return ("low", "medium", "high")[agree]


def adaptive_hits(hits: Sequence[Hit], confidence: Confidence | None, confident_k: int) -> list[Hit]:
    """The evidence for the generator: the first ``confident_k`` when retrieval is sure (0 = all), else
    all."""
    if confidence == "high" and confident_k > 0:
        return list(hits[:confident_k])
    return list(hits)
