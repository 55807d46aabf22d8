"""The walk both paged-attention kernels share (kernels/paged_attention.py, kernels/paged_attention_split.py).

A program holds one KV head's whole query group for one token: ``_query_group`` loads it in float32,
times the softmax scale (and an fp8 pool's K scale, folded into the query: one multiply per query element
instead of one per key element); ``_attend_blocks`` runs the online softmax over a range of the token's
table blocks, keys past its position masked, and returns the un-normalised partial (an fp8 pool's V scale
applied to the accumulator once). ``attention_warps`` sizes either kernel's program for the walk's tile;
``walk_compile_specs`` builds either kernel's compile checks.
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _query_group(q_ptr, t, kv_head, group, head_dim, kv_scale_ptr, scale, stride_qt, stride_qh,
                 BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr, KV_FP8: tl.constexpr):
    """q[t, group of ``kv_head``, :] in float32, times the softmax scale (and an fp8 pool's K scale), with what a
    program stores its result through: (q, its query heads, their mask, the head-dim offsets, their mask)."""
    offs_g = tl.arange(0, BLOCK_G)
    offs_d = tl.arange(0, BLOCK_D)
    g_ok, d_ok = offs_g < group, offs_d < head_dim
    q_heads = kv_head * group + offs_g
    q = tl.load(q_ptr + t * stride_qt + q_heads[:, None] * stride_qh + offs_d[None, :],
                mask=g_ok[:, None] & d_ok[None, :], other=0.0).to(tl.float32) * scale
    if KV_FP8:
        q = q * tl.load(kv_scale_ptr)
    return q, q_heads, g_ok, offs_d, d_ok


@triton.jit
def _attend_blocks(q, cache_ptr, table_ptr, kv_head, pos, first_block, end_block, kv_scale_ptr,
                   stride_kv, stride_block, stride_slot, stride_head, head_dim,
                   BLOCK_SIZE: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr, KV_FP8: tl.constexpr):
    """Online softmax of the query group over table blocks [first_block, end_block), keys past ``pos``
    masked: (running max, sum of exponentials, un-normalised accumulator in dequantized units)."""
    offs_d = tl.arange(0, BLOCK_D)
    offs_s = tl.arange(0, BLOCK_SIZE)
    d_ok = offs_d < head_dim
    m_i = tl.full((BLOCK_G,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((BLOCK_G,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_G, BLOCK_D), dtype=tl.float32)
    for j in range(first_block, end_block):
        block = tl.load(table_ptr + j).to(tl.int64)
        kv_off = block * stride_block + offs_s[:, None] * stride_slot + kv_head * stride_head + offs_d[None, :]
        s_ok = j * BLOCK_SIZE + offs_s <= pos
        kv_mask = s_ok[:, None] & d_ok[None, :]
        k = tl.load(cache_ptr + kv_off, mask=kv_mask, other=0.0).to(tl.float32)
        v = tl.load(cache_ptr + stride_kv + kv_off, mask=kv_mask, other=0.0).to(tl.float32)
        scores = tl.sum(q[:, None, :] * k[None, :, :], axis=2)
        scores = tl.where(s_ok[None, :], scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, axis=1))
        p = tl.exp(scores - m_new[:, None])
        alpha = tl.exp(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v[None, :, :], axis=1)
        m_i = m_new
    if KV_FP8:
        acc = acc * tl.load(kv_scale_ptr + 1)
    return m_i, l_i, acc


def attention_warps(group: int, head_dim: int, block_size: int) -> int:
    """Enough warps that the [group, block, head_dim] product tile stays under ~64 registers a thread."""
    elems = triton.next_power_of_2(group) * triton.next_power_of_2(head_dim) * block_size
    return min(8, max(4, elems // 2048))


def walk_compile_specs(name: str, fn, shapes, outputs: tuple) -> list:
    """Compile checks of a kernel that walks the pool (``fn``), one per (group, head_dim, dtype, block size,
    fp8 cache dtype or None) in ``shapes``; ``outputs``: its output arguments, promised 16-divisible."""
    from .compile_specs import CompileSpec, signature_of
    aligned = ("q_ptr", "cache_ptr", "stride_qt", "stride_qh", "stride_kv", "stride_block", "stride_slot",
               "stride_head", "head_dim")
    specs = []
    for group, d, dtype, bs, cache in shapes:
        constexprs = dict(BLOCK_SIZE=bs, BLOCK_G=triton.next_power_of_2(group), BLOCK_D=d, KV_FP8=cache is not None)
        types = dict(q_ptr=f"*{dtype}", cache_ptr=f"*{cache or dtype}", out_ptr=f"*{dtype}", tables_ptr="*i32",
                     tok_seq_ptr="*i32", tok_pos_ptr="*i64", kv_scale_ptr="*fp32" if cache else "*i64",
                     scale="fp32", part_max_ptr="*fp32", part_sum_ptr="*fp32", part_acc_ptr="*fp32")
        label = f"group={group} D={d} block={bs} {dtype}" + (f" kv={cache}" if cache else "")
        specs.append(CompileSpec(name, label, fn, signature_of(fn, types, constexprs), constexprs,
                                 attention_warps(group, d, bs), aligned + outputs))
    return specs
