"""Cross-encoder rerankers behind the ``Reranker`` protocol, and ``make_reranker`` to pick one by name.

The paper reranks fused candidates with bge-reranker-v2-m3 (extra ``bge``); any sentence-transformers
``CrossEncoder`` works too (extra ``st``). Both read weights already on disk and never download.
A reranker scores the same contextualized text that was indexed (``Hit.content``), falling back to
the raw evidence text.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from pipeline.errors import ConfigError, EmbeddingError
from pipeline.models.hf_embedders import resolve_local_model
from pipeline.models.loading import require_extra
from pipeline.protocols import Reranker
from pipeline.types import Hit


def hit_text(hit: Hit) -> str:
    """The passage a cross-encoder reads for ``hit``."""
    return hit.content or hit.evidence.text


def apply_scores(hits: Sequence[Hit], scores: Sequence[float]) -> list[Hit]:
    """Hits sorted by new score (stable on ties, so retrieval order breaks them), ranks from 1."""
    if len(hits) != len(scores):
        raise EmbeddingError(f"reranker returned {len(scores)} scores for {len(hits)} hits")
    order = sorted(range(len(hits)), key=lambda i: -float(scores[i]))
    return [replace(hits[i], score=float(scores[i]), rank=rank) for rank, i in enumerate(order, start=1)]


class FlagCrossEncoderReranker:
    """BAAI/bge-reranker-v2-m3 (or a local copy) through FlagEmbedding's ``FlagReranker``."""

    def __init__(
        self,
        model_name_or_path: str = "BAAI/bge-reranker-v2-m3",
        *,
        batch_size: int = 16,
        max_length: int = 512,
        use_fp16: bool = False,
    ) -> None:
        flag = require_extra("FlagEmbedding", "bge", "reranker 'bge-reranker-v2-m3'")
        path = resolve_local_model(model_name_or_path)
        try:
            try:
                self._model = flag.FlagReranker(path, use_fp16=use_fp16, devices="cpu")
            except TypeError:  # FlagEmbedding < 1.3 has no ``devices`` argument
                self._model = flag.FlagReranker(path, use_fp16=use_fp16)
        except Exception as exc:
            raise EmbeddingError(f"cannot load reranker '{model_name_or_path}': {exc}") from exc
        self.name = "bge-reranker-v2-m3" if model_name_or_path.endswith("bge-reranker-v2-m3") else model_name_or_path
        self.batch_size = batch_size
        self.max_length = max_length

    def rerank(self, query: str, hits: Sequence[Hit]) -> list[Hit]:
        if not hits:
            return []
        pairs = [[query, hit_text(h)] for h in hits]
        try:
            raw: Any = self._model.compute_score(
                pairs, batch_size=self.batch_size, max_length=self.max_length, normalize=True
            )
        except Exception as exc:
            raise EmbeddingError(f"reranker '{self.name}' failed: {exc}") from exc
        scores = [float(raw)] if np.ndim(raw) == 0 else [float(s) for s in raw]
        return apply_scores(hits, scores)


class STCrossEncoderReranker:
    """Any sentence-transformers ``CrossEncoder`` from a local path or the local HF cache."""

    def __init__(self, model_name_or_path: str, *, batch_size: int = 16, max_length: int = 512) -> None:
        st = require_extra("sentence_transformers", "st", f"reranker 'st:{model_name_or_path}'")
        path = resolve_local_model(model_name_or_path)
        try:
            self._model = st.CrossEncoder(path, max_length=max_length, device="cpu")
        except Exception as exc:
            raise EmbeddingError(f"cannot load cross-encoder '{model_name_or_path}': {exc}") from exc
        self.name = f"st:{model_name_or_path}"
        self.batch_size = batch_size

    def rerank(self, query: str, hits: Sequence[Hit]) -> list[Hit]:
        if not hits:
            return []
        pairs = [(query, hit_text(h)) for h in hits]
        try:
            raw = self._model.predict(pairs, batch_size=self.batch_size, show_progress_bar=False)
        except Exception as exc:
            raise EmbeddingError(f"reranker '{self.name}' failed: {exc}") from exc
        return apply_scores(hits, [float(s) for s in np.asarray(raw).reshape(-1)])


RERANKER_CHOICES = "none, bge-reranker-v2-m3, st:<cross-encoder>"


def make_reranker(name: str) -> Reranker | None:
    """Build the reranker ``Settings.reranker`` names; ``none`` (or empty) means no reranking."""
    key = name.strip()
    if key in ("", "none"):
        return None
    if key == "bge-reranker-v2-m3":
        return FlagCrossEncoderReranker("BAAI/bge-reranker-v2-m3")
    if key.startswith("bge-reranker-v2-m3:") and key.partition(":")[2].strip():
        return FlagCrossEncoderReranker(key.partition(":")[2].strip())
    if key.startswith("st:") and key[3:].strip():
        return STCrossEncoderReranker(key[3:].strip())
    raise ConfigError(f"unknown reranker '{name}': choose {RERANKER_CHOICES}")
