"""Write new K/V into the paged pool: token t goes to flat slot ``slot_mapping[t]`` (block * block_size +
offset) of ``kv_cache[2, num_blocks, block_size, num_kv_heads, head_dim]`` (0 = K, 1 = V), addressed
through the pool's strides (the device arena's per-layer view is block-major across layers). A
negative slot means "padding token, do not write" (graph-replayed batches carry padding rows).

An fp8 pool (e4m3 or e5m2) is written as ``k / kv_scale[0]`` and ``v / kv_scale[1]``, saturated to
the format's finite range and rounded to nearest even, exactly as gh200rt.kv.fp8.quantize does.
The rounding is done in float32 arithmetic (``round_to_fp8_grid``) so that the final conversion is
exact: the Triton interpreter's float32 -> fp8 conversion drops the carry when rounding crosses a
power of two (7.96 becomes 4.0), and the hardware's conversion gives the same bits for a value
already on the grid.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from gh200rt.kernels.triton.compile_specs import CompileSpec, signature_of
from gh200rt.kv import fp8

# torch fp8 dtype -> (Triton type name, mantissa bits, smallest normal exponent)
FP8_FORMATS = {torch.float8_e4m3fn: ("fp8e4nv", 3, -6), torch.float8_e5m2: ("fp8e5", 2, -14)}


@triton.jit
def round_to_fp8_grid(x, FP8_MAX: tl.constexpr, MANT_BITS: tl.constexpr, MIN_EXP: tl.constexpr):
    """float32 ``x`` saturated to +-FP8_MAX and rounded (to nearest even) to the fp8 format's values."""
    bits = x.to(tl.int32, bitcast=True)
    magnitude = tl.minimum((bits & 0x7FFFFFFF).to(tl.float32, bitcast=True), FP8_MAX)
    exponent = tl.maximum((magnitude.to(tl.int32, bitcast=True) >> 23) - 127, MIN_EXP)  # subnormals: MIN_EXP
    quantum = ((exponent - MANT_BITS + 127) << 23).to(tl.float32, bitcast=True)
    inverse = ((MANT_BITS - exponent + 127) << 23).to(tl.float32, bitcast=True)
    # magnitude / quantum < 2^(MANT_BITS + 1): adding 1.5 * 2^23 rounds it to an integer, to nearest even
    rounded = ((magnitude * inverse + 12582912.0) - 12582912.0) * quantum
    # the sign goes back on by bits, so -0.0 and tiny negatives keep it, as torch's conversion does
    return (rounded.to(tl.int32, bitcast=True) | (bits & -2147483648)).to(tl.float32, bitcast=True)


@triton.jit
def store_kv_kernel(k_ptr, v_ptr, cache_ptr, slot_ptr, scale_ptr, row_elems, stride_kt, stride_vt, stride_kv,
                    stride_block, stride_slot, block_size, BLOCK: tl.constexpr, QUANT: tl.constexpr,
                    FP8_MAX: tl.constexpr, MANT_BITS: tl.constexpr, MIN_EXP: tl.constexpr):
    t, chunk = tl.program_id(0).to(tl.int64), tl.program_id(1)  # int64: T * row stride passes 2^31
    slot = tl.load(slot_ptr + t)
    if slot >= 0:
        offs = chunk * BLOCK + tl.arange(0, BLOCK)
        ok = offs < row_elems
        dst = cache_ptr + (slot // block_size) * stride_block + (slot % block_size) * stride_slot + offs
        k = tl.load(k_ptr + t * stride_kt + offs, mask=ok)
        v = tl.load(v_ptr + t * stride_vt + offs, mask=ok)
        if QUANT:
            k = round_to_fp8_grid(k.to(tl.float32) / tl.load(scale_ptr), FP8_MAX, MANT_BITS, MIN_EXP)
            v = round_to_fp8_grid(v.to(tl.float32) / tl.load(scale_ptr + 1), FP8_MAX, MANT_BITS, MIN_EXP)
        tl.store(dst, k.to(cache_ptr.dtype.element_ty), mask=ok)
        tl.store(dst + stride_kv, v.to(cache_ptr.dtype.element_ty), mask=ok)


def quant_constexprs(cache_dtype: torch.dtype) -> dict:
    if cache_dtype not in FP8_FORMATS:
        return dict(QUANT=False, FP8_MAX=0.0, MANT_BITS=0, MIN_EXP=0)
    _, mant, min_exp = FP8_FORMATS[cache_dtype]
    return dict(QUANT=True, FP8_MAX=float(torch.finfo(cache_dtype).max), MANT_BITS=mant, MIN_EXP=min_exp)


def write_kv(kv_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor,
             kv_scale: torch.Tensor | None = None) -> None:
    """k, v ``[T, num_kv_heads, head_dim]`` into their slots, in place: the pool's dtype, or any float
    dtype into an fp8 pool (quantized with ``kv_scale`` = [K scale, V scale], float32)."""
    quant = quant_constexprs(kv_cache.dtype)
    assert k.dtype == v.dtype
    assert k.dtype == kv_cache.dtype or (quant["QUANT"] and kv_scale is not None), (k.dtype, kv_cache.dtype)
    assert kv_cache.stride(4) == 1 and kv_cache.stride(3) == kv_cache.shape[4], "a slot's heads must be contiguous"
    t = k.shape[0]
    row_elems = kv_cache.shape[3] * kv_cache.shape[4]
    k2, v2 = k.reshape(t, row_elems), v.reshape(t, row_elems)
    block = min(1024, triton.next_power_of_2(row_elems))
    store_kv_kernel[(t, triton.cdiv(row_elems, block))](
        k2, v2, kv_cache, slot_mapping, kv_scale if quant["QUANT"] else slot_mapping, row_elems, k2.stride(0),
        v2.stride(0), kv_cache.stride(0), kv_cache.stride(1), kv_cache.stride(2), kv_cache.shape[2], BLOCK=block,
        **quant)


def reference_write_kv(kv_cache, k, v, slot_mapping, kv_scale=None):
    if fp8.is_fp8(kv_cache.dtype):  # indexed writes have no fp8 kernel on the CPU: write the bytes
        k, v = fp8.quantize(k, kv_scale[0], kv_cache.dtype), fp8.quantize(v, kv_scale[1], kv_cache.dtype)
        kv_cache, k, v = kv_cache.view(torch.uint8), k.view(torch.uint8), v.view(torch.uint8)
    keep = slot_mapping >= 0
    slots = slot_mapping[keep]
    block_size = kv_cache.shape[2]
    kv_cache[0, slots // block_size, slots % block_size] = k[keep]
    kv_cache[1, slots // block_size, slots % block_size] = v[keep]


def compile_specs():
    specs = []
    for heads, d, dtype, cache in ((3, 64, "bf16", torch.bfloat16), (8, 128, "bf16", torch.bfloat16),
                                   (8, 128, "fp32", torch.float32), (8, 128, "bf16", torch.float8_e4m3fn),
                                   (3, 64, "fp16", torch.float8_e5m2), (8, 128, "fp32", torch.float8_e4m3fn)):
        row = heads * d
        constexprs = dict(BLOCK=min(1024, triton.next_power_of_2(row)), **quant_constexprs(cache))
        cache_type = FP8_FORMATS[cache][0] if cache in FP8_FORMATS else dtype
        types = dict(k_ptr=f"*{dtype}", v_ptr=f"*{dtype}", cache_ptr=f"*{cache_type}", slot_ptr="*i64",
                     scale_ptr="*fp32" if cache in FP8_FORMATS else "*i64")
        label = f"kv_heads={heads} D={d} {dtype}" + (f" -> {cache_type}" if cache in FP8_FORMATS else "")
        specs.append(CompileSpec("store_kv", label, store_kv_kernel,
                                 signature_of(store_kv_kernel, types, constexprs), constexprs, 4,
                                 ("k_ptr", "v_ptr", "cache_ptr", "row_elems", "stride_kt", "stride_vt", "stride_kv",
                                  "stride_block", "stride_slot")))
    return specs
