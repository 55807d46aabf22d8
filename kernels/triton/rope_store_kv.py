"""RoPE and the KV store in one launch: the attention block's step from the fused qkv projection to the pool.

``rope_and_store_kv(qkv[T, (H + 2*Hkv) * D], cos[T, 1, D/2], sin[T, 1, D/2], kv_cache, slot_mapping, heads,
kv_heads, kv_scale) -> q[T, H, D]``: q's heads rotated (rotate-half layout) into a new tensor, k's heads rotated
and v's heads copied into their pool slots (``slot_mapping``; a negative slot is a padding row and is not
written), an fp8 pool quantized with ``kv_scale`` exactly as kernels/triton/store_kv.py does. ``cos``/``sin`` are the
step's rows (already indexed by position, ``RotaryEmbedding.tables``), so no position table is built or read.

``qk_norm`` (Qwen3) normalises each q and k head first, with the layer's q_norm / k_norm weights.

Replaces ``rope`` then ``store_kv`` (two launches a layer, and a cos|sin table per step; with q/k norms five)
in the GPU attention block.
Math in float32; q and the pool get one rounding each.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from gh200rt.kernels.triton.compile_specs import CompileSpec, signature_of
from gh200rt.kernels.triton.pdl import allow_next, pdl_launch, wait_for_previous
from gh200rt.kernels.triton.store_kv import FP8_FORMATS, quant_constexprs, reference_write_kv, round_to_fp8_grid


@triton.jit
def _rotated_heads(qkv_row, cos, sin, h0, heads, offs_h, offs_d, norm_ptr, eps, HALF: tl.constexpr,
                   QK_NORM: tl.constexpr):
    """Heads ``h0 + offs_h`` of the row starting at ``qkv_row`` (each D = 2*HALF wide), RMS-normalised over the
    head with the weight at ``norm_ptr`` where QK_NORM, then rotated: (first half, second half, mask)."""
    d_ok = offs_d < HALF
    ok = ((h0 + offs_h) < heads)[:, None] & d_ok[None, :]
    src = qkv_row + (h0 + offs_h)[:, None] * (2 * HALF) + offs_d[None, :]
    x1 = tl.load(src, mask=ok, other=0.0).to(tl.float32)
    x2 = tl.load(src + HALF, mask=ok, other=0.0).to(tl.float32)
    if QK_NORM:
        inv_rms = 1.0 / tl.sqrt((tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1)) / (2 * HALF) + eps)
        x1 = x1 * inv_rms[:, None] * tl.load(norm_ptr + offs_d, mask=d_ok, other=0.0).to(tl.float32)[None, :]
        x2 = x2 * inv_rms[:, None] * tl.load(norm_ptr + HALF + offs_d, mask=d_ok, other=0.0).to(tl.float32)[None, :]
    return x1 * cos[None, :] - x2 * sin[None, :], x2 * cos[None, :] + x1 * sin[None, :], ok


@triton.jit
def _to_pool(x, scale_ptr, QUANT: tl.constexpr, FP8_MAX: tl.constexpr, MANT_BITS: tl.constexpr,
             MIN_EXP: tl.constexpr):
    if QUANT:
        return round_to_fp8_grid(x / tl.load(scale_ptr), FP8_MAX, MANT_BITS, MIN_EXP)
    return x


@triton.jit
def rope_store_kv_kernel(qkv_ptr, cos_ptr, sin_ptr, q_ptr, cache_ptr, slot_ptr, scale_ptr, q_norm_ptr, k_norm_ptr,
                         eps, heads, kv_heads, stride_qkv, stride_cos, stride_sin, stride_qt, stride_kv,
                         stride_block, stride_slot, stride_head, block_size, HALF: tl.constexpr,
                         BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, QK_NORM: tl.constexpr, QUANT: tl.constexpr,
                         FP8_MAX: tl.constexpr, MANT_BITS: tl.constexpr, MIN_EXP: tl.constexpr,
                         USE_PDL: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)  # int64: T * row stride passes 2^31 in long prefills
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < HALF
    wait_for_previous(USE_PDL)
    allow_next(USE_PDL)     # one program per token: the attention's programs may queue behind it at once
    cos = tl.load(cos_ptr + t * stride_cos + offs_d, mask=d_ok, other=0.0).to(tl.float32)
    sin = tl.load(sin_ptr + t * stride_sin + offs_d, mask=d_ok, other=0.0).to(tl.float32)
    row = qkv_ptr + t * stride_qkv
    for h0 in range(0, heads, BLOCK_H):
        first, second, ok = _rotated_heads(row, cos, sin, h0, heads, offs_h, offs_d, q_norm_ptr, eps, HALF,
                                           QK_NORM)
        dst = q_ptr + t * stride_qt + (h0 + offs_h)[:, None] * (2 * HALF) + offs_d[None, :]
        tl.store(dst, first.to(q_ptr.dtype.element_ty), mask=ok)
        tl.store(dst + HALF, second.to(q_ptr.dtype.element_ty), mask=ok)
    slot = tl.load(slot_ptr + t)
    if slot >= 0:
        k_row = row + heads * (2 * HALF)
        v_row = k_row + kv_heads * (2 * HALF)
        slot_base = cache_ptr + (slot // block_size) * stride_block + (slot % block_size) * stride_slot
        for h0 in range(0, kv_heads, BLOCK_H):
            first, second, ok = _rotated_heads(k_row, cos, sin, h0, kv_heads, offs_h, offs_d, k_norm_ptr, eps, HALF,
                                               QK_NORM)
            dst = slot_base + (h0 + offs_h)[:, None] * stride_head + offs_d[None, :]
            tl.store(dst, _to_pool(first, scale_ptr, QUANT, FP8_MAX, MANT_BITS, MIN_EXP)
                     .to(cache_ptr.dtype.element_ty), mask=ok)
            tl.store(dst + HALF, _to_pool(second, scale_ptr, QUANT, FP8_MAX, MANT_BITS, MIN_EXP)
                     .to(cache_ptr.dtype.element_ty), mask=ok)
            src = v_row + (h0 + offs_h)[:, None] * (2 * HALF) + offs_d[None, :]
            v1 = tl.load(src, mask=ok, other=0.0).to(tl.float32)
            v2 = tl.load(src + HALF, mask=ok, other=0.0).to(tl.float32)
            tl.store(dst + stride_kv, _to_pool(v1, scale_ptr + 1, QUANT, FP8_MAX, MANT_BITS, MIN_EXP)
                     .to(cache_ptr.dtype.element_ty), mask=ok)
            tl.store(dst + stride_kv + HALF, _to_pool(v2, scale_ptr + 1, QUANT, FP8_MAX, MANT_BITS, MIN_EXP)
                     .to(cache_ptr.dtype.element_ty), mask=ok)


def heads_per_iteration(heads: int, half: int) -> int:
    """Heads a program rotates at once: a [heads, D/2] tile of at most 1024 elements (two live, ~16 registers a
    thread at 4 warps)."""
    return max(1, min(triton.next_power_of_2(heads), 1024 // triton.next_power_of_2(half)))


def rope_and_store_kv(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv_cache: torch.Tensor,
                      slot_mapping: torch.Tensor, heads: int, kv_heads: int, kv_scale: torch.Tensor | None = None,
                      qk_norm: tuple[torch.Tensor, torch.Tensor, float] | None = None, pdl: bool = False) -> torch.Tensor:
    """``qk_norm`` = (q weight [D], k weight [D], eps): Qwen3's per-head RMSNorm of q and k before the rotation.
    ``pdl``: launched with programmatic dependent launch (kernels/triton/pdl.py)."""
    t, width = qkv.shape
    d = kv_cache.shape[4]
    half = d // 2
    assert width == (heads + 2 * kv_heads) * d and qkv.stride(1) == 1 and d % 2 == 0, (qkv.shape, heads, kv_heads, d)
    assert kv_cache.shape[3] == kv_heads and kv_cache.stride(4) == 1
    quant = quant_constexprs(kv_cache.dtype)
    assert not quant["QUANT"] or kv_scale is not None, "an fp8 pool is written with its layer's kv_scale"
    cos, sin = cos.reshape(t, half), sin.reshape(t, half)
    assert cos.stride(1) == 1 and sin.stride(1) == 1
    q = torch.empty(t, heads, d, dtype=qkv.dtype, device=qkv.device)
    q_norm, k_norm, eps = qk_norm if qk_norm is not None else (q, q, 0.0)
    rope_store_kv_kernel[(t,)](
        qkv, cos, sin, q, kv_cache, slot_mapping, kv_scale if quant["QUANT"] else slot_mapping, q_norm, k_norm, eps,
        heads, kv_heads, qkv.stride(0), cos.stride(0), sin.stride(0), q.stride(0), kv_cache.stride(0),
        kv_cache.stride(1), kv_cache.stride(2), kv_cache.stride(3), kv_cache.shape[2], HALF=half,
        BLOCK_H=heads_per_iteration(max(heads, kv_heads), half), BLOCK_D=triton.next_power_of_2(half),
        QK_NORM=qk_norm is not None, USE_PDL=pdl, **quant, **pdl_launch(pdl))
    return q


def reference_rope_and_store_kv(qkv, cos, sin, kv_cache, slot_mapping, heads, kv_heads, kv_scale=None, qk_norm=None):
    """The model's torch ops: (q/k norms,) rotate q and k (float32 here), write k and v with the reference store."""
    t, d = qkv.shape[0], kv_cache.shape[4]
    half = d // 2
    cos, sin = cos.reshape(t, 1, half).float(), sin.reshape(t, 1, half).float()
    x = qkv.float().view(t, heads + 2 * kv_heads, d)

    def rotate(part):
        x1, x2 = part[..., :half], part[..., half:]
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    q, k, v = x[:, :heads], x[:, heads:heads + kv_heads], x[:, heads + kv_heads:]
    if qk_norm is not None:
        q_weight, k_weight, eps = qk_norm
        q = torch.nn.functional.rms_norm(q, (d,), q_weight.float(), eps)
        k = torch.nn.functional.rms_norm(k, (d,), k_weight.float(), eps)
    q, k = rotate(q), rotate(k)
    pool_dtype = torch.float32 if kv_cache.dtype in FP8_FORMATS else kv_cache.dtype  # quantized from float32
    reference_write_kv(kv_cache, k.to(pool_dtype), v.to(pool_dtype), slot_mapping, kv_scale)
    return q.to(qkv.dtype)


def compile_specs():
    specs = []
    for heads, kv_heads, d, dtype, cache, qk_norm in (
            (9, 3, 64, "bf16", torch.bfloat16, False), (32, 8, 128, "bf16", torch.bfloat16, False),
            (64, 8, 128, "fp16", torch.float16, False), (32, 8, 128, "bf16", torch.float8_e4m3fn, False),
            (9, 3, 64, "fp32", torch.float8_e5m2, False), (32, 4, 128, "bf16", torch.bfloat16, True),
            (64, 4, 128, "bf16", torch.float8_e4m3fn, True), (32, 8, 128, "bf16", "PDL", False)):
        pdl = cache == "PDL"
        cache = torch.bfloat16 if pdl else cache
        half = d // 2
        constexprs = dict(HALF=half, BLOCK_H=heads_per_iteration(heads, half), BLOCK_D=half, QK_NORM=qk_norm,
                          USE_PDL=pdl, **quant_constexprs(cache))
        cache_type = FP8_FORMATS[cache][0] if cache in FP8_FORMATS else dtype
        types = dict(qkv_ptr=f"*{dtype}", cos_ptr=f"*{dtype}", sin_ptr=f"*{dtype}", q_ptr=f"*{dtype}",
                     q_norm_ptr=f"*{dtype}", k_norm_ptr=f"*{dtype}", eps="fp32", cache_ptr=f"*{cache_type}",
                     slot_ptr="*i64",
                     scale_ptr="*fp32" if cache in FP8_FORMATS else "*i64")
        label = f"heads={heads}/{kv_heads} D={d} {dtype} -> {cache_type}" + (" q/k norms" if qk_norm else "") \
            + (" PDL" if pdl else "")
        specs.append(CompileSpec("rope_store_kv", label, rope_store_kv_kernel,
                                 signature_of(rope_store_kv_kernel, types, constexprs), constexprs, 4,
                                 ("qkv_ptr", "cos_ptr", "sin_ptr", "q_ptr", "cache_ptr", "stride_qkv", "stride_cos",
                                  "stride_sin", "stride_qt", "stride_kv", "stride_block", "stride_slot",
                                  "stride_head")))
    return specs
