"""What the weight-reading kernels (host_gemm, gemv, fused_moe) read of a weight: its format code and operands, and
the torch reference they are checked against."""
from __future__ import annotations

import torch

from gh200rt.formats.pack import reference_linear
from gh200rt.formats.packed_weight import PackedWeight

FMT_DENSE, FMT_SCALED, FMT_INT4 = 0, 1, 2  # SCALED: int8 or fp8 codes times a scale per group


def weight_operands(weight, placeholder: torch.Tensor | None = None):
    """(FMT, codes or dense weight, scale, minimum, group size) of a dense tensor, ``HalfWeight``,
    ``HostDenseWeight`` or ``PackedWeight``; arguments a format does not read are ``placeholder`` (default: the weight itself)."""
    if isinstance(weight, PackedWeight):
        fmt = FMT_INT4 if weight.fmt == "int4" else FMT_SCALED
        minimum = weight.minimum if weight.minimum is not None else weight.scale
        return fmt, weight.qweight, weight.scale, minimum, weight.group_size
    if isinstance(weight, torch.Tensor):
        dense = weight
    else:   # HalfWeight (``tensors``) or a dense view of host memory (``storage``): one tensor
        (dense,) = (weight.tensors() if hasattr(weight, "tensors") else weight.storage()).values()
    unused = dense if placeholder is None else placeholder
    return FMT_DENSE, dense, unused, unused, dense.shape[1]


def reference_host_gemm(x: torch.Tensor, weight: torch.Tensor | PackedWeight,
                        bias: torch.Tensor | None = None) -> torch.Tensor:
    """Plain torch in float32."""
    if isinstance(weight, PackedWeight):
        return reference_linear(x, weight, bias)
    return torch.nn.functional.linear(x.float(), weight.float(), None if bias is None else bias.float())
