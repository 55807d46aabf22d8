"""Paged attention over a latent KV pool (DeepSeek-V2 / V3's absorbed latent attention, models/layers/mla.py).

``mla_attention(q[T, H, D], cache[NB, BS, 1, D], meta, scale, kv_scale=None) -> [T, H, D]``: every query head attends
to the one latent row per position (D = kv_lora_rank + rope: 576 for V3), which is both its key and its value, as
``paged_attention`` computes it with one KV head whose K and V planes are the same memory (the torch route's
stride-0 view). The generic kernel would pad D to a power of two (576 -> 1024) and load each row twice; this one
splits the row at the largest power of two in it (512 + 64 for V3: the latent and the rotary key, exactly), so the
scores are two dots and the value update reuses the tiles the scores read. A program takes ``HEAD_TILE`` query heads
of one token and walks its context a block at a time (online softmax in float32, the keys past its position masked),
so decode and short chunks take it; the caller keeps the first ``kv_lora_rank`` values of each head's output.
An fp8 pool is read with the layer's ``kv_scale`` (both entries equal: the row is K and V). Table entries past the
device pool's blocks name host KV blocks, read in place (``host``: kv/host_blocks.py).

Split-K (flash-decoding) for long contexts at small batches: one program per token and head tile walks the whole
context, so V3's 128 heads at batch 1 are 8 programs on 132 SMs. ``latent_splits`` cuts each token's context into S
contiguous shares (grid axis 2; the shares are cut on the device from the token's own length, so a graph replays
with new lengths), each writes its float32 partial (max, sum, accumulator), and the partials are combined with the
usual rescaling. S comes from host ints only (the table's padded width), as ``paged_attention_split`` picks it.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from gh200rt.kernels.triton.compile_specs import CompileSpec, signature_of
from gh200rt.kernels.triton.host_gemm import TARGET_PROGRAMS
from gh200rt.kernels.triton.paged_attention import token_layout
from gh200rt.kernels.triton.paged_attention_walk import NO_HOST_BLOCKS

HEAD_TILE = 16      # query heads a program takes (tl.dot's smallest tile side)
MIN_SHARE_TOKENS = 256   # a split's share of a context is never cut shorter (its partial and combine cost more)


@triton.jit
def _latent_walk(q_w, q_r, cache_ptr, table, first, end, pos, offs_w, offs_r, r_ok, stride_block, stride_slot,
                 host_ptr, host_first, stride_host_block,
                 BLOCK_SIZE: tl.constexpr, HEAD_TILE: tl.constexpr, WIDE: tl.constexpr, REST: tl.constexpr,
                 DOT_PRECISION: tl.constexpr, HOST_BLOCKS: tl.constexpr):
    """Online softmax over context blocks [first, end) of one token: (max, sum, accumulator) in float32. With
    ``HOST_BLOCKS`` a table entry ``host_first`` or above is block ``entry - host_first`` of the host pool at
    ``host_ptr`` (read in place; its slot stride is the device pool's)."""
    m_i = tl.full((HEAD_TILE,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((HEAD_TILE,), dtype=tl.float32)
    acc_w = tl.zeros((HEAD_TILE, WIDE), dtype=tl.float32)
    acc_r = tl.zeros((HEAD_TILE, REST), dtype=tl.float32)
    offs_k = tl.arange(0, BLOCK_SIZE)
    for j in range(first, end):
        block = tl.load(table + j).to(tl.int64)
        if HOST_BLOCKS:
            base = tl.where(block >= host_first, host_ptr + (block - host_first) * stride_host_block,
                            cache_ptr + block * stride_block)
        else:
            base = cache_ptr + block * stride_block
        rows = base + offs_k[:, None] * stride_slot
        key_ok = j * BLOCK_SIZE + offs_k <= pos
        k_w = tl.load(rows + offs_w[None, :], mask=key_ok[:, None], other=0.0).to(tl.float32)
        k_r = tl.load(rows + offs_r[None, :], mask=key_ok[:, None] & r_ok[None, :], other=0.0).to(tl.float32)
        scores = tl.dot(q_w, tl.trans(k_w), input_precision=DOT_PRECISION) + \
            tl.dot(q_r, tl.trans(k_r), input_precision=DOT_PRECISION)
        scores = tl.where(key_ok[None, :], scores, float("-inf"))   # a block's first slot is always a key
        m_new = tl.maximum(m_i, tl.max(scores, axis=1))
        p = tl.exp(scores - m_new[:, None])
        alpha = tl.exp(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc_w = acc_w * alpha[:, None] + tl.dot(p, k_w, input_precision=DOT_PRECISION)
        acc_r = acc_r * alpha[:, None] + tl.dot(p, k_r, input_precision=DOT_PRECISION)
        m_i = m_new
    return m_i, l_i, acc_w, acc_r


@triton.jit
def _scaled_queries(q_ptr, kv_scale_ptr, scale, t, heads, h_ok, offs_w, offs_r, r_ok, stride_qt, stride_qh,
                    KV_FP8: tl.constexpr):
    q_rows = q_ptr + t * stride_qt + heads[:, None] * stride_qh
    q_w = tl.load(q_rows + offs_w[None, :], mask=h_ok[:, None], other=0.0).to(tl.float32) * scale
    q_r = tl.load(q_rows + offs_r[None, :], mask=h_ok[:, None] & r_ok[None, :], other=0.0).to(tl.float32) * scale
    if KV_FP8:
        q_w = q_w * tl.load(kv_scale_ptr)
        q_r = q_r * tl.load(kv_scale_ptr)
    return q_w, q_r


@triton.jit
def mla_attention_kernel(q_ptr, cache_ptr, out_ptr, tables_ptr, tok_seq_ptr, tok_pos_ptr, kv_scale_ptr, scale,
                         num_heads, head_dim, stride_qt, stride_qh, stride_ot, stride_oh, stride_table,
                         stride_block, stride_slot, host_ptr, host_first, stride_host_block,
                         BLOCK_SIZE: tl.constexpr, HEAD_TILE: tl.constexpr, WIDE: tl.constexpr,
                         REST: tl.constexpr, KV_FP8: tl.constexpr, DOT_PRECISION: tl.constexpr,
                         HOST_BLOCKS: tl.constexpr):
    t, tile = tl.program_id(0), tl.program_id(1)
    seq = tl.load(tok_seq_ptr + t)
    pos = tl.load(tok_pos_ptr + t)
    heads = tile * HEAD_TILE + tl.arange(0, HEAD_TILE)
    h_ok = heads < num_heads
    offs_w = tl.arange(0, WIDE)                 # the row's first WIDE values (the latent)
    offs_r = WIDE + tl.arange(0, REST)          # the rest (the rotary key), masked past head_dim
    r_ok = offs_r < head_dim
    q_w, q_r = _scaled_queries(q_ptr, kv_scale_ptr, scale, t, heads, h_ok, offs_w, offs_r, r_ok, stride_qt,
                               stride_qh, KV_FP8)
    m_i, l_i, acc_w, acc_r = _latent_walk(q_w, q_r, cache_ptr, tables_ptr + seq * stride_table, 0,
                                          pos // BLOCK_SIZE + 1, pos, offs_w, offs_r, r_ok, stride_block, stride_slot,
                                          host_ptr, host_first, stride_host_block,
                                          BLOCK_SIZE, HEAD_TILE, WIDE, REST, DOT_PRECISION, HOST_BLOCKS)
    norm = 1.0 / l_i
    if KV_FP8:
        norm = norm * tl.load(kv_scale_ptr + 1)
    out_rows = out_ptr + t * stride_ot + heads[:, None] * stride_oh
    tl.store(out_rows + offs_w[None, :], (acc_w * norm[:, None]).to(out_ptr.dtype.element_ty), mask=h_ok[:, None])
    tl.store(out_rows + offs_r[None, :], (acc_r * norm[:, None]).to(out_ptr.dtype.element_ty),
             mask=h_ok[:, None] & r_ok[None, :])


@triton.jit
def mla_attention_split_kernel(q_ptr, cache_ptr, part_max_ptr, part_sum_ptr, part_acc_ptr, tables_ptr, tok_seq_ptr,
                               tok_pos_ptr, kv_scale_ptr, scale, num_heads, head_dim, num_splits, stride_qt,
                               stride_qh, stride_table, stride_block, stride_slot, host_ptr, host_first,
                               stride_host_block,
                               BLOCK_SIZE: tl.constexpr, HEAD_TILE: tl.constexpr, WIDE: tl.constexpr,
                               REST: tl.constexpr, KV_FP8: tl.constexpr, DOT_PRECISION: tl.constexpr,
                               HOST_BLOCKS: tl.constexpr):
    """Split ``split``'s partial of a token's head tile into part_max / part_sum [T, H, S] and part_acc [T, H, S, D]
    (float32); an empty share (a context shorter than S blocks) writes max -inf, sum 0, accumulator 0."""
    t, tile, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    seq = tl.load(tok_seq_ptr + t)
    pos = tl.load(tok_pos_ptr + t)
    blocks = pos // BLOCK_SIZE + 1
    per_split = tl.cdiv(blocks, num_splits)
    first = split * per_split
    end = tl.minimum(first + per_split, blocks)
    heads = tile * HEAD_TILE + tl.arange(0, HEAD_TILE)
    h_ok = heads < num_heads
    offs_w = tl.arange(0, WIDE)
    offs_r = WIDE + tl.arange(0, REST)
    r_ok = offs_r < head_dim
    q_w, q_r = _scaled_queries(q_ptr, kv_scale_ptr, scale, t, heads, h_ok, offs_w, offs_r, r_ok, stride_qt,
                               stride_qh, KV_FP8)
    m_i, l_i, acc_w, acc_r = _latent_walk(q_w, q_r, cache_ptr, tables_ptr + seq * stride_table, first, end, pos,
                                          offs_w, offs_r, r_ok, stride_block, stride_slot,
                                          host_ptr, host_first, stride_host_block,
                                          BLOCK_SIZE, HEAD_TILE, WIDE, REST, DOT_PRECISION, HOST_BLOCKS)
    rows = (t.to(tl.int64) * num_heads + heads) * num_splits + split
    tl.store(part_max_ptr + rows, m_i, mask=h_ok)
    tl.store(part_sum_ptr + rows, l_i, mask=h_ok)
    acc_rows = part_acc_ptr + rows[:, None] * head_dim
    tl.store(acc_rows + offs_w[None, :], acc_w, mask=h_ok[:, None])
    tl.store(acc_rows + offs_r[None, :], acc_r, mask=h_ok[:, None] & r_ok[None, :])


def latent_splits(tokens: int, num_heads: int, table_blocks: int, block_size: int,
                  target_programs: int = TARGET_PROGRAMS) -> int:
    """Splits of each token's context: enough to bring tokens x head tiles programs up to ``target_programs``, as
    long as the longest context the table holds keeps shares of ``MIN_SHARE_TOKENS`` or more. Host ints only."""
    programs = max(1, tokens * triton.cdiv(num_heads, HEAD_TILE))
    return max(1, min(target_programs // programs, table_blocks * block_size // MIN_SHARE_TOKENS))


def combine_partials(part_max: torch.Tensor, part_sum: torch.Tensor, part_acc: torch.Tensor,
                     v_scale: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    """[T, H, D] from the splits' partials: each rescaled to the common max (an empty split weighs 0), summed,
    normalised (and an fp8 pool's V scale applied)."""
    weight = torch.exp(part_max - part_max.amax(dim=2, keepdim=True))     # split 0 always has work: finite max
    norm = (part_sum * weight).sum(dim=2, keepdim=True)
    out = (part_acc * weight[..., None]).sum(dim=2) / norm
    if v_scale is not None:
        out = out * v_scale
    return out.to(dtype)


def row_split(head_dim: int) -> tuple[int, int]:
    """(WIDE, REST): the largest power of two in the row, and the rest padded to one (16 at least: tl.dot's tile)."""
    wide = 1 << (head_dim.bit_length() - 1)
    rest = head_dim - wide
    return wide, max(16, triton.next_power_of_2(rest)) if rest else 16


def mla_constexprs(head_dim: int, block_size: int, kv_fp8: bool, fp32_pool: bool, host_blocks: bool = False) -> dict:
    wide, rest = row_split(head_dim)
    return dict(BLOCK_SIZE=block_size, HEAD_TILE=HEAD_TILE, WIDE=wide, REST=rest, KV_FP8=kv_fp8,
                DOT_PRECISION="ieee" if fp32_pool else "tf32", HOST_BLOCKS=host_blocks)


def latent_host_operands(cache: torch.Tensor, host) -> tuple:
    """(pointer, first host id, block stride) of ``host``'s one-plane pool (a ``HostBlocksView``), or of none (the
    device pool stands in: no table entry reaches it)."""
    if host is None:
        return cache, NO_HOST_BLOCKS, 0
    pool = host.pool[0]
    assert pool.dtype == cache.dtype and pool.device == cache.device, (pool.dtype, pool.device, cache.device)
    assert pool.shape[1:] == cache.shape[1:] and pool.stride()[1:] == cache.stride()[1:], \
        "a host block's rows are laid out as a device block's"
    assert host.first_id >= cache.shape[0], "host ids start past the device pool's blocks"
    return pool, host.first_id, pool.stride(0)


def mla_warps(head_dim: int, block_size: int) -> int:
    """4 warps up to a block of 16 of V3's rows (213 registers, none spilled), 8 past it (a block of 64 spills 1 KB
    at 4 warps; a block of 16 spills 8 bytes at 8: ptxas aims at 128 registers there), as scripts/check_kernels.py
    finds them."""
    return 8 if block_size * head_dim > 16 * 576 else 4


def mla_attention(q: torch.Tensor, cache: torch.Tensor, meta, scale: float,
                  kv_scale: torch.Tensor | None = None, num_splits: int | None = None, host=None) -> torch.Tensor:
    """``cache``: the one-plane latent pool ``[NB, BS, 1, D]`` (rows contiguous); ``num_splits``: shares of each
    token's context (default ``latent_splits``; 1: one pass, no partials); ``host``: the layer's host KV blocks
    (``kv.host_blocks.HostBlocksView``), which table entries from ``host.first_id`` on name."""
    t, num_heads, head_dim = q.shape
    assert cache.shape[2] == 1 and cache.shape[3] == head_dim and cache.stride(3) == 1, (cache.shape, q.shape)
    assert head_dim >= 16, head_dim
    kv_fp8 = cache.dtype in (torch.float8_e4m3fn, torch.float8_e5m2)
    assert kv_scale is not None or not kv_fp8, "an fp8 pool is read with its layer's kv_scale"
    tok_seq, tok_pos = token_layout(meta)
    tables = meta.block_tables
    block_size = cache.shape[1]
    scales = kv_scale if kv_fp8 else tok_pos
    constexprs = mla_constexprs(head_dim, block_size, kv_fp8, cache.dtype == torch.float32, host is not None)
    host_args = latent_host_operands(cache, host)
    splits = latent_splits(t, num_heads, tables.shape[1], block_size) if num_splits is None else num_splits
    if splits > 1:
        part_max = torch.empty(t, num_heads, splits, dtype=torch.float32, device=q.device)
        part_sum = torch.empty_like(part_max)
        part_acc = torch.empty(t, num_heads, splits, head_dim, dtype=torch.float32, device=q.device)
        mla_attention_split_kernel[(t, triton.cdiv(num_heads, HEAD_TILE), splits)](
            q, cache, part_max, part_sum, part_acc, tables, tok_seq, tok_pos, scales, scale, num_heads, head_dim,
            splits, q.stride(0), q.stride(1), tables.stride(0), cache.stride(0), cache.stride(1), *host_args,
            num_warps=mla_warps(head_dim, block_size), **constexprs)
        return combine_partials(part_max, part_sum, part_acc, kv_scale[1] if kv_fp8 else None, q.dtype)
    out = torch.empty_like(q)
    mla_attention_kernel[(t, triton.cdiv(num_heads, HEAD_TILE))](
        q, cache, out, tables, tok_seq, tok_pos, scales, scale, num_heads, head_dim,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1), tables.stride(0), cache.stride(0), cache.stride(1),
        *host_args, num_warps=mla_warps(head_dim, block_size), **constexprs)
    return out


def compile_specs():
    specs = []
    for d, dtype, bs, cache in ((576, "bf16", 16, None), (576, "bf16", 64, None), (576, "bf16", 16, "fp8e4nv"),
                                (576, "fp16", 16, None), (192, "bf16", 16, None), (576, "bf16", 16, "host")):
        host = cache == "host"            # the bf16 pool, tables naming host blocks too
        cache = None if host else cache
        constexprs = mla_constexprs(d, bs, cache is not None, (cache or dtype) == "fp32", host)
        types = dict(q_ptr=f"*{dtype}", cache_ptr=f"*{cache or dtype}", host_ptr=f"*{cache or dtype}",
                     out_ptr=f"*{dtype}", tables_ptr="*i32", tok_seq_ptr="*i32", tok_pos_ptr="*i64",
                     kv_scale_ptr="*fp32" if cache else "*i64", scale="fp32")
        label = f"D={d} block={bs} {dtype}" + (f" kv={cache}" if cache else "") + (" host blocks" if host else "")
        specs.append(CompileSpec("mla_attention", label, mla_attention_kernel,
                                 signature_of(mla_attention_kernel, types, constexprs), constexprs, mla_warps(d, bs),
                                 ("q_ptr", "cache_ptr", "out_ptr", "stride_qt", "stride_qh", "stride_ot", "stride_oh",
                                  "stride_block", "stride_slot", "head_dim", "host_ptr", "stride_host_block")))
        split_types = {**types, "part_max_ptr": "*fp32", "part_sum_ptr": "*fp32", "part_acc_ptr": "*fp32"}
        specs.append(CompileSpec("mla_attention", f"split {label}", mla_attention_split_kernel,
                                 signature_of(mla_attention_split_kernel, split_types, constexprs), constexprs,
                                 mla_warps(d, bs), ("q_ptr", "cache_ptr", "part_acc_ptr", "stride_qt", "stride_qh",
                                                    "stride_block", "stride_slot", "head_dim", "host_ptr",
                                                    "stride_host_block")))
    return specs
