"""Embedders from optional extras: sentence-transformers models (``st:<model>``) and bge-m3 (dense + sparse).

Their weights are not bundled: they load from a local path or the Hugging Face cache the operator filled.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.errors import EmbeddingError
from pipeline.models.device import pick_device
from pipeline.models.loading import normalise_rows, require_extra
from pipeline.types import SparseVector


def resolve_local_model(name_or_path: str) -> str:
    """A local folder for a model: the path itself, or the Hugging Face cache; never downloads."""
    if Path(name_or_path).expanduser().exists():
        return str(Path(name_or_path).expanduser())
    try:
        from huggingface_hub import snapshot_download
    except ImportError as exc:
        raise EmbeddingError(
            f"model '{name_or_path}' is not a local path and huggingface_hub is absent"
        ) from exc
    try:
        return str(snapshot_download(name_or_path, local_files_only=True))
    except Exception as exc:
        raise EmbeddingError(
            f"model '{name_or_path}' is not on disk; fetch it once with `hf download {name_or_path}` "
            "or give a local path"
        ) from exc


class SentenceTransformerEmbedder:
    """Any sentence-transformers bi-encoder from a local path or the local HF cache (extra ``st``)."""

    def __init__(
        self, model_name_or_path: str, *, batch_size: int = 32, max_tokens: int = 128, progress: bool = False,
        device: str = "auto",
    ) -> None:
        st = require_extra("sentence_transformers", "st", f"embedder 'st:{model_name_or_path}'")
        path = resolve_local_model(model_name_or_path)
        self.device = pick_device(device)
        if self.device == "cuda":  # a GPU wants big batches: 8x the CPU batch (256 texts by default)
            batch_size *= 8
        try:
            self._model = st.SentenceTransformer(path, device=self.device)
        except Exception as exc:
            raise EmbeddingError(
                f"cannot load sentence-transformers model '{model_name_or_path}': {exc}"
            ) from exc
        if max_tokens > 0:
            self._model.max_seq_length = min(max_tokens, self._model.max_seq_length or max_tokens)
        self.name = f"st:{model_name_or_path}"
        self.dim = int(self._model.get_sentence_embedding_dimension())
        self.batch_size = max(1, batch_size)
        self.max_tokens = max_tokens
        self.progress = progress

    def embed_documents(self, texts: Sequence[str]) -> np.ndarray:
        return self._embed(texts)

    def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        return self._embed(texts)

    def close(self) -> None:
        """Nothing to release: the model lives in this process and goes with it."""

    def _embed(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        vectors = self._model.encode(
            list(texts), batch_size=self.batch_size, show_progress_bar=self.progress,
            convert_to_numpy=True, normalize_embeddings=True,
        )
        return normalise_rows(vectors)


class BgeM3Embedder:
    """BAAI/bge-m3 via FlagEmbedding (extra ``bge``): dense vectors plus learned lexical weights.

    ``sparse_encoder()`` exposes the lexical weights as a ``SparseEncoder``, so one model serves
    both halves of hybrid retrieval as in the paper.
    """

    name = "bge-m3"
    dim = 1024

    def __init__(
        self,
        model_name_or_path: str = "BAAI/bge-m3",
        *,
        batch_size: int = 16,
        max_tokens: int = 512,
        progress: bool = False,
        use_fp16: bool | None = None,
        device: str = "auto",
    ) -> None:
        flag = require_extra("FlagEmbedding", "bge", "embedder 'bge-m3'")
        path = resolve_local_model(model_name_or_path)
        self.device = pick_device(device)
        if self.device == "cuda":
            batch_size *= 8
        use_fp16 = self.device == "cuda" if use_fp16 is None else use_fp16
        try:
            try:
                self._model = flag.BGEM3FlagModel(path, use_fp16=use_fp16, devices=self.device)
            except TypeError:  # FlagEmbedding < 1.3 has no ``devices`` argument
                self._model = flag.BGEM3FlagModel(path, use_fp16=use_fp16)
        except Exception as exc:
            raise EmbeddingError(f"cannot load bge-m3 from '{model_name_or_path}': {exc}") from exc
        self.batch_size = max(1, batch_size)
        self.max_tokens = max_tokens if max_tokens > 0 else 8192
        self.progress = progress
        self._lock = threading.Lock()

    def encode(self, texts: Sequence[str], *, sparse: bool) -> dict[str, Any]:
        """Raw FlagEmbedding output: ``dense_vecs`` and, if ``sparse``, ``lexical_weights``."""
        with self._lock:
            return dict(
                self._model.encode(
                    list(texts), batch_size=self.batch_size, max_length=self.max_tokens,
                    return_dense=True, return_sparse=sparse, return_colbert_vecs=False,
                )
            )

    def embed_documents(self, texts: Sequence[str]) -> np.ndarray:
        return self._embed(texts)

    def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        return self._embed(texts)

    def close(self) -> None:
        """Nothing to release: the model lives in this process and goes with it."""

    def _embed(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        return normalise_rows(np.asarray(self.encode(texts, sparse=False)["dense_vecs"]))

    def sparse_encoder(self) -> BgeM3SparseEncoder:
        return BgeM3SparseEncoder(self)


def lexical_to_sparse(weights: dict[Any, float]) -> SparseVector:
    """bge-m3 ``{token_id: weight}`` → a ``SparseVector`` with sorted unique indices."""
    merged: dict[int, float] = {}
    for key, value in weights.items():
        idx = int(key)
        merged[idx] = max(merged.get(idx, 0.0), float(value))
    ordered = sorted((i, v) for i, v in merged.items() if v > 0)
    return SparseVector(indices=tuple(i for i, _ in ordered), values=tuple(v for _, v in ordered))


class BgeM3SparseEncoder:
    """The lexical (sparse) head of bge-m3 as a ``SparseEncoder``; token id → learned weight.

    These weights already encode term importance, so an index should not apply IDF on top.
    """

    name = "bge-m3"
    idf = False

    def __init__(self, embedder: BgeM3Embedder) -> None:
        self._embedder = embedder

    def encode_documents(self, texts: Sequence[str]) -> list[SparseVector]:
        if not texts:
            return []
        return [lexical_to_sparse(w) for w in self._embedder.encode(texts, sparse=True)["lexical_weights"]]

    def encode_query(self, text: str) -> SparseVector:
        return self.encode_documents([text])[0]
