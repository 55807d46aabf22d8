"""How the weight formats multiply activations on CUDA: the ``host_gemm`` Triton kernel reads a ``PackedWeight``'s
codes and scales, or a ``HalfWeight``'s fp16 tensor, in place (resident, staged or in host memory) and upcasts each
tile in registers."""
from __future__ import annotations

import torch


def linear(weight, x: torch.Tensor, bias: torch.Tensor | None = None, native: bool = True) -> torch.Tensor:
    from gh200rt.kernels.triton.host_gemm import host_gemm
    return host_gemm(x, weight.weight if weight.fmt == "fp16" else weight, bias)


def dense_for(weight, x: torch.Tensor, native: bool = True) -> None:
    """The kernel reads every packed format as it is: no dense stand-in."""
    return None


def block_form(weight, x: torch.Tensor, rows: int, native: bool = True):
    return weight
