"""An fp8 KV cache (``--kv-cache-dtype fp8|fp8_e4m3|fp8_e5m2``, vLLM's values): the pool stores fp8,
K and V are divided by their layer's scale when written and multiplied by it when read.

Every attention layer owns ``kv_scale``: a float32 ``[2]`` tensor (K scale, V scale) on the model's
device, allocated with the layer and updated only in place, so kernels read it through a fixed
address. The scales are 1.0 unless the checkpoint carries them (``self_attn.k_scale`` /
``v_scale``) or ``--calculate-kv-scales`` is on: then each layer sets them once, from the first
batch it sees, to that batch's largest magnitude over the fp8 maximum (so the first batch uses
the whole fp8 range and nothing in it saturates). Values beyond ``scale x fp8 max`` saturate
(as vLLM's kernels do); they never become NaN.

The torch functions here are the CPU path and the references of the Triton kernels
(kernels/triton/store_kv.py, kernels/triton/paged_attention.py).
"""
from __future__ import annotations

import torch

from gh200rt.config import KV_CACHE_DTYPES

FP8_KV_DTYPES = {"fp8": torch.float8_e4m3fn, "fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}


def kv_cache_dtype(flag: str, compute_dtype: torch.dtype) -> torch.dtype:
    """The pool's element type for ``--kv-cache-dtype`` (``auto``: the compute dtype)."""
    if flag == "auto":
        return compute_dtype
    if flag not in FP8_KV_DTYPES:
        raise ValueError(f"--kv-cache-dtype {flag!r}: choose one of {', '.join(KV_CACHE_DTYPES)}")
    return FP8_KV_DTYPES[flag]


def check_device_supports(dtype: torch.dtype, device: str) -> None:
    """An fp8 pool on a GPU needs fp8 conversions in hardware (compute capability 8.9: Ada, Hopper)."""
    if not is_fp8(dtype) or not str(device).startswith("cuda"):
        return
    major, minor = torch.cuda.get_device_capability(device)
    if (major, minor) < (8, 9):
        raise ValueError(f"--kv-cache-dtype fp8 needs a GPU of compute capability 8.9 or newer (Ada, Hopper); this "
                         f"one is {major}.{minor}: use --kv-cache-dtype auto")


def is_fp8(dtype: torch.dtype) -> bool:
    return dtype in (torch.float8_e4m3fn, torch.float8_e5m2)


def quantize(x: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``x / scale`` in float32, saturated to ``dtype``'s finite range, rounded to nearest even."""
    limit = torch.finfo(dtype).max
    return (x.to(torch.float32) / scale).clamp(-limit, limit).to(dtype)


def dequantize(x: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return (x.to(torch.float32) * scale).to(dtype)


def calculated_scales(k: torch.Tensor, v: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``[K scale, V scale]``: each tensor's largest magnitude over ``dtype``'s maximum (1.0 for all zeros)."""
    amax = torch.stack([k.detach().abs().amax(), v.detach().abs().amax()]).to(torch.float32)
    return torch.where(amax > 0, amax / torch.finfo(dtype).max, torch.ones_like(amax))
