"""Group redundant evidence (RAGonite Algorithm 1, step 1).

Removing one of two identical passages changes nothing, so their credit would be lost; removing
near-duplicates together lets counterfactuals see the shared contribution.
"""

from __future__ import annotations

import numpy as np
from sklearn.cluster import DBSCAN

from pipeline.errors import InputError


def cluster_embeddings(
    embeddings: np.ndarray, *, eps: float = 0.005, min_samples: int = 2
) -> list[list[int]]:
    """DBSCAN (cosine distance) over row embeddings; noise points become singleton clusters.

    Returns lists of row indices, each sorted, clusters ordered by their first row, so ids are stable.
    Cosine distances are computed here (rows re-normalised) and passed as a precomputed matrix, which
    equals ``metric="cosine"`` but clips the tiny negative distances float error gives identical texts.
    """
    if embeddings.ndim != 2:
        raise InputError(f"expected a 2-D embedding matrix, got shape {embeddings.shape}")
    n = embeddings.shape[0]
    if n == 0:
        return []
    if n == 1:
        return [[0]]
    vectors = embeddings.astype(np.float64)
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    vectors = vectors / np.where(norms == 0.0, 1.0, norms)
    distances = np.clip(1.0 - vectors @ vectors.T, 0.0, 2.0)
    np.fill_diagonal(distances, 0.0)
    labels = DBSCAN(eps=eps, min_samples=min_samples, metric="precomputed").fit_predict(distances)
    groups: dict[int, list[int]] = {}
    singletons: list[list[int]] = []
    for row, label in enumerate(labels.tolist()):
        if label < 0:
            singletons.append([row])
        else:
            groups.setdefault(int(label), []).append(row)
    return sorted([*groups.values(), *singletons], key=lambda g: g[0])
