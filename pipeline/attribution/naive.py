"""The paper's naive baseline: credit the evidence whose text looks most like the answer.

No generation calls, so it is instant, but it is correlational: it rewards evidence that repeats the
answer's words, not evidence that caused it. Kept as a baseline and a fallback.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from pipeline.attribution.params import AttributionParams
from pipeline.attribution.scoring import answer_likeness, assemble
from pipeline.attribution.types import AttributionResult
from pipeline.protocols import Embedder
from pipeline.types import Hit


async def naive_attribution(
    *, question: str, answer: str, hits: Sequence[Hit], embedder: Embedder, params: AttributionParams
) -> AttributionResult:
    """p = softmax(cosine(answer, evidence_i) / t) per evidence; ``similarities`` holds the cosine."""
    started = time.perf_counter()
    groups = [[i] for i in range(len(hits))]
    cosines = await answer_likeness(embedder, answer, hits)
    return assemble(
        method="naive",
        question=question,
        answer=answer,
        hits=hits,
        groups=groups,
        contributions=cosines,
        temperature=params.temperature,
        similarities=[[c] for c in cosines],
        likeness=cosines,
        params=params.public(),
        seconds=time.perf_counter() - started,
    )
