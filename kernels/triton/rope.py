"""Rotary position embedding (rotate-half / NeoX layout, as Llama, Mistral and Qwen use in HF form).

``cos_sin_cache[max_pos, D]`` holds ``cos`` in its first D/2 columns and ``sin`` in the rest (any
RoPE scaling is already baked in by whoever builds it). ``q[T, Hq, D]`` and ``k[T, Hk, D]`` are
returned rotated for their ``positions[T]``; the inputs are not modified.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from gh200rt.kernels.triton.compile_specs import CompileSpec, signature_of


@triton.jit
def rope_kernel(x_ptr, y_ptr, pos_ptr, cache_ptr, heads, stride_xt, stride_xh, stride_yt, stride_yh,
                stride_cache, HALF: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)  # int64: T * stride passes 2^31 in long prefills
    pos = tl.load(pos_ptr + t)
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < HALF
    cos = tl.load(cache_ptr + pos * stride_cache + offs_d, mask=d_ok, other=0.0).to(tl.float32)
    sin = tl.load(cache_ptr + pos * stride_cache + HALF + offs_d, mask=d_ok, other=0.0).to(tl.float32)
    ok = (offs_h < heads)[:, None] & d_ok[None, :]
    x_off = t * stride_xt + offs_h[:, None] * stride_xh + offs_d[None, :]
    x1 = tl.load(x_ptr + x_off, mask=ok, other=0.0).to(tl.float32)
    x2 = tl.load(x_ptr + x_off + HALF, mask=ok, other=0.0).to(tl.float32)
    y_off = t * stride_yt + offs_h[:, None] * stride_yh + offs_d[None, :]
    tl.store(y_ptr + y_off, (x1 * cos[None, :] - x2 * sin[None, :]).to(y_ptr.dtype.element_ty), mask=ok)
    tl.store(y_ptr + y_off + HALF, (x2 * cos[None, :] + x1 * sin[None, :]).to(y_ptr.dtype.element_ty), mask=ok)


def rotate(x: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor) -> torch.Tensor:
    """One ``x[T, heads, D]`` (q or k) rotated for ``positions[T]``; a new contiguous tensor."""
    t, heads, d = x.shape
    if x.stride(-1) != 1:
        x = x.contiguous()
    y = torch.empty(t, heads, d, dtype=x.dtype, device=x.device)
    rope_kernel[(t,)](x, y, positions, cos_sin_cache, heads, x.stride(0), x.stride(1), y.stride(0), y.stride(1),
                      cos_sin_cache.stride(0), HALF=d // 2, BLOCK_H=triton.next_power_of_2(heads),
                      BLOCK_D=triton.next_power_of_2(d // 2))
    return y


def apply_rope(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor,
               cos_sin_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if q.shape[-1] % 2 or q.shape[-1] != cos_sin_cache.shape[-1]:
        raise ValueError(f"rope: head_dim {q.shape[-1]} must be even and match the cache width "
                         f"{cos_sin_cache.shape[-1]}")
    return rotate(q, positions, cos_sin_cache), rotate(k, positions, cos_sin_cache)


def build_cos_sin_cache(head_dim: int, max_pos: int, base: float = 10000.0) -> torch.Tensor:
    """Unscaled RoPE table ``[max_pos, head_dim]`` in float32."""
    inv_freq = 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angles = torch.arange(max_pos, dtype=torch.float64)[:, None] * inv_freq[None, :]
    return torch.cat([angles.cos(), angles.sin()], dim=-1).to(torch.float32)


def reference_rope(q, k, positions, cos_sin_cache):
    half = q.shape[-1] // 2
    cos, sin = cos_sin_cache[positions].float().split(half, dim=-1)
    cos, sin = cos[:, None, :], sin[:, None, :]

    def rotate_ref(x):
        x1, x2 = x.float().split(half, dim=-1)
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)
    return rotate_ref(q), rotate_ref(k)


def compile_specs():
    specs = []
    for heads, d, dtype in ((9, 64, "bf16"), (32, 128, "bf16"), (8, 128, "fp16")):
        constexprs = dict(HALF=d // 2, BLOCK_H=triton.next_power_of_2(heads), BLOCK_D=d // 2)
        types = dict(x_ptr=f"*{dtype}", y_ptr=f"*{dtype}", pos_ptr="*i64", cache_ptr="*fp32")
        specs.append(CompileSpec("rope", f"heads={heads} D={d} {dtype}", rope_kernel,
                                 signature_of(rope_kernel, types, constexprs), constexprs, 4,
                                 ("x_ptr", "y_ptr", "cache_ptr", "stride_xt", "stride_xh", "stride_yt", "stride_yh",
                                  "stride_cache")))
    return specs
