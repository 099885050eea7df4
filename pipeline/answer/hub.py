"""Graph ("hub") reranking: evidence that resembles much of the rest of what was retrieved gains.

The retrieved evidence forms a similarity graph (lexical cosine of their BM25 vectors). An evidence's
centrality is its mean similarity to the others; a hit's new score is its fused score plus ``weight`` x that
centrality. The idea (from retriever-chain designs): when several retrieved pieces talk about the same thing,
the piece at the centre of that cluster is likelier the answer than an isolated lucky match.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

from pipeline.protocols import SparseEncoder
from pipeline.types import Hit


def centrality(vectors: Sequence[dict[int, float]]) -> list[float]:
    """Each vector's mean cosine similarity to the others (0 for a single vector)."""
    norms = [math.sqrt(sum(v * v for v in vec.values())) or 1.0 for vec in vectors]
    n = len(vectors)
    totals = [0.0] * n
    for i in range(n):
        for j in range(i + 1, n):
            small, large = (
                (vectors[i], vectors[j]) if len(vectors[i]) <= len(vectors[j]) else (vectors[j], vectors[i])
            )
            sim = sum(w * large.get(t, 0.0) for t, w in small.items()) / (norms[i] * norms[j])
            totals[i] += sim
            totals[j] += sim
    return [t / (n - 1) if n > 1 else 0.0 for t in totals]


def hub_rerank(hits: Sequence[Hit], sparse: SparseEncoder, weight: float) -> list[Hit]:
    """``hits`` re-scored by ``score + weight x centrality`` and re-ranked (ties keep their order)."""
    if weight <= 0 or len(hits) < 2:
        return list(hits)
    encoded = sparse.encode_documents([h.content or h.evidence.text for h in hits])
    central = centrality([dict(zip(v.indices, v.values, strict=True)) for v in encoded])
    return rescore(hits, [h.score + weight * c for h, c in zip(hits, central, strict=True)])


def rescore(hits: Sequence[Hit], scores: Sequence[float]) -> list[Hit]:
    """``hits`` with new ``scores``, re-ranked by them (ties keep their order); shared by every re-scoring
    option."""
    ordered = sorted(zip(scores, hits, strict=True), key=lambda t: (t[0], -t[1].rank), reverse=True)
    return [replace(h, score=score, rank=rank) for rank, (score, h) in enumerate(ordered, start=1)]
