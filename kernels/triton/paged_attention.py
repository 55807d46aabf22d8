"""Attention of new tokens over the paged KV pool, causal, with grouped-query heads.

``paged_attention(q[T, Hq, D], kv_cache[2, NB, BS, Hkv, D], meta, scale, num_kv_heads) -> [T, Hq, D]``
(the signature of gh200rt.kv.attention's torch version). Each query token attends to the cached
positions ``0..p`` of its own sequence, ``p`` its absolute position, read through the block
table; its K/V must already be in the pool (``write_kv`` first). A program handles one KV head's
whole query group for one token, so decode (one token per sequence) and prefill over a
prefix-cached context take the same route: correct for any query length, and efficient for
decode; long uncached prompts are better served by a tiled prefill kernel (not written yet).
Online softmax in float32; every load is upcast first. An fp8 pool (e4m3 / e5m2) is dequantized
with the layer's ``kv_scale`` = [K scale, V scale]: the K scale is folded into the query, the V scale
into each program's accumulator (the walk both kernels share: kernels/triton/paged_attention_walk.py).

With ``num_splits`` S > 1 (``attention_splits`` picks S when the caller does not) each token's context
is cut into S shares walked in parallel and combined: the split-K route, kernels/triton/paged_attention_split.py.
S = 1 launches the single-pass kernel here alone, with no scratch and no combine.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from gh200rt.kernels.triton.paged_attention_split import attention_splits, split_paged_attention
from gh200rt.kernels.triton.paged_attention_walk import (attend_blocks, attention_warps, host_operands, query_group,
                                                         walk_compile_specs, walk_constexprs)
from gh200rt.kv.host_blocks import HostBlocksView
from gh200rt.kernels.triton.pdl import allow_next, pdl_launch, wait_for_previous


@triton.jit
def paged_attention_kernel(q_ptr, cache_ptr, out_ptr, tables_ptr, tok_seq_ptr, tok_pos_ptr, kv_scale_ptr, scale,
                           group, stride_qt, stride_qh, stride_ot, stride_oh, stride_table,
                           stride_kv, stride_block, stride_slot, stride_head, head_dim,
                           host_ptr, host_first, stride_host_kv, stride_host_block,
                           BLOCK_SIZE: tl.constexpr, TILE_BLOCKS: tl.constexpr, BLOCK_G: tl.constexpr,
                           BLOCK_D: tl.constexpr, KV_FP8: tl.constexpr, DOT_PRECISION: tl.constexpr,
                           HOST_BLOCKS: tl.constexpr, USE_PDL: tl.constexpr):
    t, kv_head = tl.program_id(0), tl.program_id(1)
    wait_for_previous(USE_PDL)
    seq = tl.load(tok_seq_ptr + t)
    pos = tl.load(tok_pos_ptr + t)
    q, q_heads, g_ok, offs_d, d_ok = query_group(q_ptr, t, kv_head, group, head_dim, kv_scale_ptr, scale,
                                                  stride_qt, stride_qh, BLOCK_G, BLOCK_D, KV_FP8)
    _, l_i, acc = attend_blocks(q, cache_ptr, tables_ptr + seq * stride_table, kv_head, pos,
                                 0, pos // BLOCK_SIZE + 1, kv_scale_ptr,
                                 stride_kv, stride_block, stride_slot, stride_head, head_dim,
                                 host_ptr, host_first, stride_host_kv, stride_host_block,
                                 BLOCK_SIZE, TILE_BLOCKS, BLOCK_G, BLOCK_D, KV_FP8, DOT_PRECISION, HOST_BLOCKS)
    allow_next(USE_PDL)
    tl.store(out_ptr + t * stride_ot + q_heads[:, None] * stride_oh + offs_d[None, :],
             (acc / l_i[:, None]).to(out_ptr.dtype.element_ty), mask=g_ok[:, None] & d_ok[None, :])


_LAYOUT_KEY = "_triton_paged_attention_tokens"


def token_layout(meta) -> tuple[torch.Tensor, torch.Tensor]:
    """(sequence index int32, absolute position int64) of every new token, built once per step.

    Computed on the device from ``query_start_loc`` / ``seq_lens`` (sizes from the host lists), so
    no host list is copied per call and the step can be captured into a CUDA graph. It is cached on
    ``meta``: a graph runner that refills one metadata object in place must let the first layer
    build it inside the capture, so replays recompute it from the refilled buffers.
    """
    layout = meta.__dict__.get(_LAYOUT_KEY)
    if layout is None:
        starts, device = meta.query_start_loc, meta.query_start_loc.device
        tokens = meta.num_tokens
        seq = torch.repeat_interleave(torch.arange(meta.num_seqs, device=device), starts[1:] - starts[:-1],
                                      output_size=tokens)
        # token t of sequence b sits at seq_len[b] - (end of b's tokens - t)
        pos = meta.seq_lens[seq] - starts[1:][seq] + torch.arange(tokens, device=device)
        layout = meta.__dict__[_LAYOUT_KEY] = (seq.to(torch.int32), pos.to(torch.int64))
    return layout


def paged_attention(q: torch.Tensor, kv_cache: torch.Tensor, meta, scale: float, num_kv_heads: int,
                    kv_scale: torch.Tensor | None = None, num_splits: int | None = None,
                    pdl: bool = False, host: HostBlocksView | None = None) -> torch.Tensor:
    """``num_splits``: None picks it with ``attention_splits``; an int forces it (1: the single-pass kernel).
    ``pdl``: launched with programmatic dependent launch (kernels/triton/pdl.py). ``host``: the layer's host KV
    blocks, which table entries from ``host.first_id`` on name and the kernel reads in place."""
    t, num_heads, head_dim = q.shape
    assert kv_cache.shape[3] == num_kv_heads and kv_cache.shape[4] == head_dim and num_heads % num_kv_heads == 0
    kv_fp8 = kv_cache.dtype in (torch.float8_e4m3fn, torch.float8_e5m2)
    assert kv_scale is not None or not kv_fp8, "an fp8 pool is read with its layer's kv_scale"
    group = num_heads // num_kv_heads
    out = torch.empty_like(q)
    tok_seq, tok_pos = token_layout(meta)
    tables = meta.block_tables
    block_size = kv_cache.shape[2]
    if num_splits is None:
        num_splits = attention_splits(t, num_kv_heads, tables.shape[1], block_size)
    elif num_splits < 1:
        raise ValueError(f"paged_attention: num_splits must be 1 or more (or None to choose), got {num_splits}")
    scales = kv_scale if kv_fp8 else tok_pos
    pool_operands = (kv_cache.stride(0), kv_cache.stride(1), kv_cache.stride(2), kv_cache.stride(3), head_dim,
                     *host_operands(kv_cache, host))
    fp32_pool = kv_cache.dtype == torch.float32
    walk = dict(walk_constexprs(group, head_dim, block_size, kv_fp8, fp32_pool, host is not None),
                num_warps=attention_warps(head_dim, block_size, fp32_pool, kv_fp8), USE_PDL=pdl, **pdl_launch(pdl))
    if num_splits == 1:
        paged_attention_kernel[(t, num_kv_heads)](
            q, kv_cache, out, tables, tok_seq, tok_pos, scales, scale, group,
            q.stride(0), q.stride(1), out.stride(0), out.stride(1), tables.stride(0), *pool_operands, **walk)
        return out
    return split_paged_attention(q, kv_cache, out, tables, tok_seq, tok_pos, scales, scale, group, num_splits,
                                 pool_operands, walk)


def reference_paged_attention(q, kv_cache, meta, scale, num_kv_heads, kv_scale=None, host=None):
    """Gather each sequence's K/V from its blocks (an fp8 pool: times ``kv_scale``; entries from ``host.first_id``
    on from the host pool) and run causal attention in float32."""
    kv_scale = torch.ones(2, device=q.device) if kv_scale is None else kv_scale.float()
    out = torch.empty_like(q)
    group = q.shape[1] // num_kv_heads
    block_size = kv_cache.shape[2]
    start = 0
    for b, (q_len, s_len) in enumerate(zip(meta.query_lens_list, meta.seq_lens_list)):
        blocks = meta.block_tables[b, : -(-s_len // block_size)].long().tolist()
        pools = [kv_cache[:, i] if host is None or i < host.first_id else host.pool[:, i - host.first_id]
                 for i in blocks]
        k = torch.stack([p[0] for p in pools]).reshape(-1, num_kv_heads, q.shape[2])[:s_len].float() * kv_scale[0]
        v = torch.stack([p[1] for p in pools]).reshape(-1, num_kv_heads, q.shape[2])[:s_len].float() * kv_scale[1]
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        qs = q[start:start + q_len].float()
        scores = torch.einsum("thd,shd->hts", qs, k) * scale
        q_pos = torch.arange(s_len - q_len, s_len, device=q.device)[:, None]
        scores = scores.masked_fill(torch.arange(s_len, device=q.device)[None, :] > q_pos, float("-inf"))
        out[start:start + q_len] = torch.einsum("hts,shd->thd", scores.softmax(-1), v).to(q.dtype)
        start += q_len
    return out


def compile_specs():
    walks = ((3, 64, "bf16", 16, None), (4, 128, "bf16", 16, None), (8, 128, "fp16", 16, None),
             (4, 128, "bf16", 32, None), (8, 128, "bf16", 16, "fp8e4nv"),
             (4, 128, "bf16", 32, "fp8e4nv"), (3, 64, "fp16", 16, "fp8e5"), (4, 128, "fp32", 16, None),
             (1, 128, "bf16", 128, None), (4, 128, "bf16", 16, "PDL"), (8, 128, "bf16", 16, "host"))
    return walk_compile_specs("paged_attention", paged_attention_kernel, walks, ("out_ptr", "stride_ot", "stride_oh"))
