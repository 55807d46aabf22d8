"""Dense float32 linear on the CPU: oneDNN's inner product when this torch build has it, else ``F.linear``.

At decode shapes (a few rows against a 0.3-30 M element weight) ``F.linear`` goes through MKL and
reads weights well below the machine's memory bandwidth; oneDNN's inner product over the same
dense ``[N, K]`` tensor is faster (docs/benchmarks/models.md) and reads it in place — no reordered
copy — so views into host slabs and staging slots work as they are.

The op is private (``torch.ops.mkldnn._linear_pointwise``), so it is probed once, at first use,
against ``F.linear`` (bias / no bias, one and several rows, non-contiguous input); when it is
missing (aarch64 builds, other torch versions) or disagrees, ``F.linear`` serves every call of
the process. The route depends only on dtypes, device and weight size, never on where the weight
lives, so the same weight bytes give the same bits in every tier (DESIGN invariant 4).

One rule for one row: every float32 oneDNN linear — over a dense weight here, or over a resident
weight reordered at start-up (``cpu_prepack.OneDNNWeight``) — runs with at least two rows. A
single-row input gets one zero row appended and the first output row is returned. oneDNN takes a
GEMV kernel at one row whose bits differ from its GEMM's, and a reordered weight never takes it,
so without the rule a resident layer and a streamed or direct one would disagree at batch 1. Rows
do not mix in an inner product, so the appended row cannot change the real row's bits (tested).
The cost falls on dense weights at one row (SmolLM2-135M, all 121 linears, one decode step on 2
AVX2 cores: ~35 -> ~54 ms); a reordered weight costs the same at one row as at two
(docs/benchmarks/models.md).

With the native CPU kernels (``--cpu-kernels native``), float32 linears of up to
``NATIVE_F32_MAX_ROWS`` rows (a decode step of a few sequences) go to ``kernels/cpu/f32_linear.c``
instead (``native_dense_linear``, set on every ``RefLinear`` by ``models/cpu_kernels.py``): it streams
the dense weight in place at close to the memory's speed, where oneDNN's two-row inner product reads
it at half that (SmolLM2-135M, one decode step of all 121 linears on 2 AVX2 cores: ~24 ms against ~36
ms reordered, docs/benchmarks/kernels.md). Its bits depend on the row and the weight's values alone,
so every tier still agrees; resident weights keep their dense bytes for it beside the reordered copy
(``cpu_prepack.NativeRowsWeight``).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

# oneDNN costs ~20 us more per call than F.linear; below ~1 MiB of weight that outweighs the gain.
ONEDNN_MIN_ELEMENTS = 1 << 18
# Up to this many rows a float32 linear runs the native kernel (with the native CPU kernels on). On 2 AVX2
# cores it beats oneDNN's reordered weights up to ~12 rows (it re-reads each block of weights from cache per
# row, oneDNN multiplies register tiles of rows); 8 keeps a margin.
NATIVE_F32_MAX_ROWS = 8

_onednn_ok: bool | None = None  # None: not probed yet


def onednn_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """oneDNN's inner product over a dense or reordered float32 weight, with the one-row rule."""
    if x.numel() != x.shape[-1]:
        return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")
    rows = torch.cat([x.reshape(1, -1), x.new_zeros(1, x.shape[-1])])
    out = torch.ops.mkldnn._linear_pointwise(rows, weight, bias, "none", [], "")
    return out[:1].reshape(*x.shape[:-1], out.shape[-1])


def _probe_onednn() -> bool:
    gen = torch.Generator().manual_seed(0)
    weight, bias = torch.randn(24, 40, generator=gen), torch.randn(24, generator=gen)
    inputs = [torch.randn(1, 40, generator=gen), torch.randn(5, 40, generator=gen),
              torch.randn(2, 3, 40, generator=gen), torch.randn(5, 80, generator=gen)[:, ::2]]
    try:
        for x in inputs:
            for b in (None, bias):
                got, want = onednn_linear(x, weight, b), F.linear(x, weight, b)
                if got.shape != want.shape or got.dtype != want.dtype \
                        or not torch.allclose(got, want, rtol=1e-5, atol=1e-5):
                    return False
    except (AttributeError, NotImplementedError, RuntimeError):
        return False
    return True


def onednn_available() -> bool:
    global _onednn_ok
    if _onednn_ok is None:
        _onednn_ok = _probe_onednn()
    return _onednn_ok


def onednn_weight(weight: torch.Tensor) -> bool:
    """Whether ``dense_linear`` sends float32 activations against this weight to oneDNN (a large contiguous
    float32 CPU weight, and oneDNN passed its probe): the weights a resident reordered copy may stand in for."""
    return (weight.dtype == torch.float32 and weight.device.type == "cpu" and weight.dim() == 2
            and weight.is_contiguous() and weight.numel() >= ONEDNN_MIN_ELEMENTS and onednn_available())


def uses_onednn(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    """Whether ``dense_linear`` sends this call to oneDNN (float32 CPU tensors, large contiguous weight)."""
    return (x.dtype == torch.float32 and x.device.type == "cpu" and x.numel() > 0
            and (bias is None or bias.dtype == torch.float32)
            and not (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad))
            and onednn_weight(weight))


def dense_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x W^T (+ b)`` for a dense weight, through the fastest exact route this process has."""
    if uses_onednn(x, weight, bias):
        return onednn_linear(x, weight, bias)
    return F.linear(x, weight, bias)


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
