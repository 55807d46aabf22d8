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
weight reordered at start-up (``backends.cpu.prepack.OneDNNWeight``) — runs with at least two rows. A
single-row input gets one zero row appended and the first output row is returned. oneDNN takes a
GEMV kernel at one row whose bits differ from its GEMM's, and a reordered weight never takes it,
so without the rule a resident layer and a streamed or direct one would disagree at batch 1. Rows
do not mix in an inner product, so the appended row cannot change the real row's bits (tested).
The cost falls on dense weights at one row (SmolLM2-135M, all 121 linears, one decode step on 2
AVX2 cores: ~35 -> ~54 ms); a reordered weight costs the same at one row as at two
(docs/benchmarks/models.md).

With the native CPU kernels, float32 linears of a few rows go to the native kernel instead
(``backends/cpu/linear.py``).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

# oneDNN costs ~20 us more per call than F.linear; below ~1 MiB of weight that outweighs the gain.
ONEDNN_MIN_ELEMENTS = 1 << 18

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
