"""Dense float32 linears of a few rows on the native CPU kernel (``kernels/cpu/f32_linear.c``).

With the native CPU kernels (``--cpu-kernels native``), float32 linears of up to
``NATIVE_F32_MAX_ROWS`` rows (a decode step of a few sequences) go to ``kernels/cpu/f32_linear.c``
instead (``native_dense_linear``, set on every ``RefLinear`` by ``backends/cpu/ops.py``): it streams
the dense weight in place at close to the memory's speed, where oneDNN's two-row inner product reads
it at half that (SmolLM2-135M, one decode step of all 121 linears on 2 AVX2 cores: ~24 ms against ~36
ms reordered, docs/benchmarks/kernels.md). Its bits depend on the row and the weight's values alone,
so every tier still agrees; resident weights keep their dense bytes for it beside the reordered copy
(``prepack.NativeRowsWeight``).
"""
from __future__ import annotations

import torch

from gh200rt.models.layers.dense import dense_linear

# Up to this many rows a float32 linear runs the native kernel (with the native CPU kernels on). On 2 AVX2
# cores it beats oneDNN's reordered weights up to ~12 rows (it re-reads each block of weights from cache per
# row, oneDNN multiplies register tiles of rows); 8 keeps a margin.
NATIVE_F32_MAX_ROWS = 8


def native_rows(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    """Whether ``native_dense_linear`` sends this call to the native kernel: float32 CPU tensors, 1 to
    ``NATIVE_F32_MAX_ROWS`` rows, a 2-D weight with unit column stride."""
    return x.dtype == torch.float32 and x.is_cpu and x.numel() > 0 and \
        native_rows_weight(x.numel() // x.shape[-1], x.shape[-1], weight, bias)


def native_rows_weight(rows: int, k: int, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    """``native_rows`` for ``rows`` float32 CPU rows of ``k`` columns."""
    return (weight.dtype == torch.float32 and 0 < rows <= NATIVE_F32_MAX_ROWS and weight.is_cpu
            and weight.dim() == 2 and weight.stride(1) == 1 and k == weight.shape[1]
            and (bias is None or (bias.dtype == torch.float32 and bias.is_cpu and bias.shape == weight.shape[:1])))


def native_dense_linear(ops):
    """``dense_linear`` with float32 calls of a few rows on ``ops.f32_linear`` (``ops``: the loaded NativeOps).
    The function carries ``ops`` as ``native_ops``, which tells the fused decode layer what it stands for."""
    def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        if native_rows(x, weight, bias):
            return ops.f32_linear_checked(x, weight, bias)
        return dense_linear(x, weight, bias)
    linear.native_ops = ops
    return linear
