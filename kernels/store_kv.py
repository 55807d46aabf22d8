"""Write new K/V into the paged pool: token t goes to flat slot ``slot_mapping[t]`` (block * block_size +
offset) of ``kv_cache[2, num_blocks, block_size, num_kv_heads, head_dim]`` (0 = K, 1 = V), addressed
through the pool's strides (the device arena's per-layer view is block-major across layers). A
negative slot means "padding token, do not write" (graph-replayed batches carry padding rows)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def store_kv_kernel(k_ptr, v_ptr, cache_ptr, slot_ptr, row_elems, stride_kt, stride_vt, stride_kv, stride_block,
                    stride_slot, block_size, BLOCK: tl.constexpr):
    t, chunk = tl.program_id(0).to(tl.int64), tl.program_id(1)  # int64: T * row stride passes 2^31
    slot = tl.load(slot_ptr + t)
    if slot >= 0:
        offs = chunk * BLOCK + tl.arange(0, BLOCK)
        ok = offs < row_elems
        dst = cache_ptr + (slot // block_size) * stride_block + (slot % block_size) * stride_slot + offs
        tl.store(dst, tl.load(k_ptr + t * stride_kt + offs, mask=ok), mask=ok)
        tl.store(dst + stride_kv, tl.load(v_ptr + t * stride_vt + offs, mask=ok), mask=ok)


def write_kv(kv_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """k, v ``[T, num_kv_heads, head_dim]`` (same dtype as the pool) into their slots, in place."""
    assert k.dtype == kv_cache.dtype == v.dtype
    assert kv_cache.stride(4) == 1 and kv_cache.stride(3) == kv_cache.shape[4], "a slot's heads must be contiguous"
    t = k.shape[0]
    row_elems = kv_cache.shape[3] * kv_cache.shape[4]
    k2, v2 = k.reshape(t, row_elems), v.reshape(t, row_elems)
    block = min(1024, triton.next_power_of_2(row_elems))
    store_kv_kernel[(t, triton.cdiv(row_elems, block))](
        k2, v2, kv_cache, slot_mapping, row_elems, k2.stride(0), v2.stride(0), kv_cache.stride(0),
        kv_cache.stride(1), kv_cache.stride(2), kv_cache.shape[2], BLOCK=block)


def reference_write_kv(kv_cache, k, v, slot_mapping):
    keep = slot_mapping >= 0
    slots = slot_mapping[keep]
    block_size = kv_cache.shape[2]
    kv_cache[0, slots // block_size, slots % block_size] = k[keep]
    kv_cache[1, slots // block_size, slots % block_size] = v[keep]


def compile_specs():
    from .compile_specs import CompileSpec, signature_of
    specs = []
    for heads, d, dtype in ((3, 64, "bf16"), (8, 128, "bf16"), (8, 128, "fp32")):
        row = heads * d
        constexprs = dict(BLOCK=min(1024, triton.next_power_of_2(row)))
        types = dict(k_ptr=f"*{dtype}", v_ptr=f"*{dtype}", cache_ptr=f"*{dtype}", slot_ptr="*i64")
        specs.append(CompileSpec("store_kv", f"kv_heads={heads} D={d} {dtype}", store_kv_kernel,
                                 signature_of(store_kv_kernel, types, constexprs), constexprs, 4,
                                 ("k_ptr", "v_ptr", "cache_ptr", "row_elems", "stride_kt", "stride_vt", "stride_kv",
                                  "stride_block", "stride_slot")))
    return specs
