"""Attention of new tokens over the paged KV pool, causal, with grouped-query heads.

``paged_attention(q[T, Hq, D], kv_cache[2, NB, BS, Hkv, D], meta, scale, num_kv_heads) -> [T, Hq, D]``
(the signature of gh200rt.kv.attention's torch version). Each query token attends to the cached
positions ``0..p`` of its own sequence, ``p`` its absolute position, read through the block
table; its K/V must already be in the pool (``write_kv`` first). A program handles one KV head's
whole query group for one token, so decode (one token per sequence) and prefill over a
prefix-cached context take the same route: correct for any query length, and efficient for
decode; long uncached prompts are better served by a tiled prefill kernel (not written yet).
Online softmax in float32; every load is upcast first. An fp8 pool (e4m3 / e5m2) is dequantized
with the layer's ``kv_scale`` = [K scale, V scale]: the K scale is folded into the query (one multiply
per query element instead of one per key element), the V scale into each program's accumulator.

Split-K (flash-decoding). With ``num_splits`` S > 1 the grid is (token, KV head, split): split ``s``
walks the ``s``-th of S contiguous, equal shares of the token's own context blocks and writes its
un-normalised float32 partial (max, sum, accumulator); a second kernel combines a token's splits per
query head with the usual rescaling. The shares are cut on the device from the token's position, so
every split has work once the context has S blocks, whatever the block table's padded width, and
the grid depends on shapes only: a CUDA graph captured once replays correctly with new lengths and
tables. A split whose share is empty (context shorter than S blocks) exits at once and the combine
skips it. S = 1 launches the single-pass kernel alone, with no scratch and no combine.

``attention_splits`` picks S when the caller does not: decode at small batch gives tokens x KV heads
programs, far fewer than the ``TARGET_PROGRAMS`` a Hopper GPU keeps resident (Llama-3-8B at batch 1:
8 programs on 132 SMs), so each program's serial walk over the context bounds the step. Splitting
multiplies the programs up to that target, but never cuts the longest context the table can hold
into shares under ``MIN_PARTITION_TOKENS``: a shorter share would spend more on its partial's write
and combine than its parallelism saves. Batch 64 x 8 KV heads already fills the target, so it keeps
one split and pays no combine. This is a first guess to be tuned by measurement
(scripts/bench_gpu_attention.py).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .host_gemm import TARGET_PROGRAMS

MIN_PARTITION_TOKENS = 256
COMBINE_SPLITS_TILE = 32  # splits the combine loads per step: a [32, D] float32 tile


@triton.jit
def _scaled_query_group(q_ptr, t, q_heads, g_ok, d_ok, offs_d, kv_scale_ptr, scale, stride_qt, stride_qh,
                        KV_FP8: tl.constexpr):
    """q[t, group of the KV head, :] in float32, times the softmax scale (and an fp8 pool's K scale)."""
    q = tl.load(q_ptr + t * stride_qt + q_heads[:, None] * stride_qh + offs_d[None, :],
                mask=g_ok[:, None] & d_ok[None, :], other=0.0).to(tl.float32) * scale
    if KV_FP8:
        q = q * tl.load(kv_scale_ptr)
    return q


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


@triton.jit
def _split_share(pos, split, num_splits, BLOCK_SIZE: tl.constexpr):
    """(first block, end block, splits with work) of ``split``'s share of a token at ``pos``."""
    blocks = pos // BLOCK_SIZE + 1
    per_split = tl.cdiv(blocks, num_splits)
    first = split * per_split
    return first, tl.minimum(first + per_split, blocks), tl.cdiv(blocks, per_split)


@triton.jit
def paged_attention_kernel(q_ptr, cache_ptr, out_ptr, tables_ptr, tok_seq_ptr, tok_pos_ptr, kv_scale_ptr, scale,
                           group, stride_qt, stride_qh, stride_ot, stride_oh, stride_table,
                           stride_kv, stride_block, stride_slot, stride_head, head_dim,
                           BLOCK_SIZE: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr,
                           KV_FP8: tl.constexpr):
    t, kv_head = tl.program_id(0), tl.program_id(1)
    seq = tl.load(tok_seq_ptr + t)
    pos = tl.load(tok_pos_ptr + t)
    offs_g = tl.arange(0, BLOCK_G)
    offs_d = tl.arange(0, BLOCK_D)
    g_ok, d_ok = offs_g < group, offs_d < head_dim
    q_heads = kv_head * group + offs_g
    q = _scaled_query_group(q_ptr, t, q_heads, g_ok, d_ok, offs_d, kv_scale_ptr, scale, stride_qt, stride_qh, KV_FP8)
    _, l_i, acc = _attend_blocks(q, cache_ptr, tables_ptr + seq * stride_table, kv_head, pos,
                                 0, pos // BLOCK_SIZE + 1, kv_scale_ptr,
                                 stride_kv, stride_block, stride_slot, stride_head, head_dim,
                                 BLOCK_SIZE, BLOCK_G, BLOCK_D, KV_FP8)
    tl.store(out_ptr + t * stride_ot + q_heads[:, None] * stride_oh + offs_d[None, :],
             (acc / l_i[:, None]).to(out_ptr.dtype.element_ty), mask=g_ok[:, None] & d_ok[None, :])


@triton.jit
def paged_attention_split_kernel(q_ptr, cache_ptr, part_max_ptr, part_sum_ptr, part_acc_ptr, tables_ptr,
                                 tok_seq_ptr, tok_pos_ptr, kv_scale_ptr, scale, group, num_splits,
                                 stride_qt, stride_qh, stride_table,
                                 stride_kv, stride_block, stride_slot, stride_head, head_dim,
                                 BLOCK_SIZE: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr,
                                 KV_FP8: tl.constexpr):
    """One split's partial into part_*[T, Hq, S] (max, sum) and part_acc[T, Hq, S, D], all float32."""
    t, kv_head, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    pos = tl.load(tok_pos_ptr + t)
    first, end, _ = _split_share(pos, split, num_splits, BLOCK_SIZE)
    if first >= end:
        return
    seq = tl.load(tok_seq_ptr + t)
    offs_g = tl.arange(0, BLOCK_G)
    offs_d = tl.arange(0, BLOCK_D)
    g_ok, d_ok = offs_g < group, offs_d < head_dim
    q_heads = kv_head * group + offs_g
    q = _scaled_query_group(q_ptr, t, q_heads, g_ok, d_ok, offs_d, kv_scale_ptr, scale, stride_qt, stride_qh, KV_FP8)
    m_i, l_i, acc = _attend_blocks(q, cache_ptr, tables_ptr + seq * stride_table, kv_head, pos, first, end,
                                   kv_scale_ptr, stride_kv, stride_block, stride_slot, stride_head, head_dim,
                                   BLOCK_SIZE, BLOCK_G, BLOCK_D, KV_FP8)
    rows = (t.to(tl.int64) * tl.num_programs(1) * group + q_heads) * num_splits + split
    tl.store(part_max_ptr + rows, m_i, mask=g_ok)
    tl.store(part_sum_ptr + rows, l_i, mask=g_ok)
    tl.store(part_acc_ptr + rows[:, None] * head_dim + offs_d[None, :], acc, mask=g_ok[:, None] & d_ok[None, :])


@triton.jit
def paged_attention_combine_kernel(part_max_ptr, part_sum_ptr, part_acc_ptr, out_ptr, tok_pos_ptr, num_splits,
                                   stride_ot, stride_oh, head_dim,
                                   BLOCK_SIZE: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr):
    """out[t, head] from the splits with work: each partial rescaled to the common max, summed, normalised."""
    t, head = tl.program_id(0), tl.program_id(1)
    pos = tl.load(tok_pos_ptr + t)
    _, _, with_work = _split_share(pos, 0, num_splits, BLOCK_SIZE)
    first_row = (t.to(tl.int64) * tl.num_programs(1) + head) * num_splits
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < head_dim
    m_run = tl.full((), float("-inf"), dtype=tl.float32)
    l_run = tl.zeros((), dtype=tl.float32)
    acc = tl.zeros((BLOCK_D,), dtype=tl.float32)
    for s0 in range(0, with_work, BLOCK_S):
        s_ok = s0 + offs_s < with_work
        rows = first_row + s0 + offs_s
        m = tl.load(part_max_ptr + rows, mask=s_ok, other=float("-inf"))
        l = tl.load(part_sum_ptr + rows, mask=s_ok, other=0.0)
        part = tl.load(part_acc_ptr + rows[:, None] * head_dim + offs_d[None, :],
                       mask=s_ok[:, None] & d_ok[None, :], other=0.0)
        m_new = tl.maximum(m_run, tl.max(m, axis=0))  # finite: split s0 has work
        weight = tl.exp(m - m_new)
        alpha = tl.exp(m_run - m_new)
        l_run = l_run * alpha + tl.sum(weight * l, axis=0)
        acc = acc * alpha + tl.sum(weight[:, None] * part, axis=0)
        m_run = m_new
    tl.store(out_ptr + t * stride_ot + head * stride_oh + offs_d, (acc / l_run).to(out_ptr.dtype.element_ty),
             mask=d_ok)


def attention_warps(group: int, head_dim: int, block_size: int) -> int:
    """Enough warps that the [group, block, head_dim] product tile stays under ~64 registers a thread."""
    elems = triton.next_power_of_2(group) * triton.next_power_of_2(head_dim) * block_size
    return min(8, max(4, elems // 2048))


def attention_splits(tokens: int, num_kv_heads: int, table_blocks: int, block_size: int,
                     target_programs: int = TARGET_PROGRAMS) -> int:
    """Splits of each token's context: enough to bring tokens x KV heads programs up to ``target_programs``,
    as long as the longest context the table holds keeps shares of ``MIN_PARTITION_TOKENS`` or more.
    Host ints only (the table's padded width, never the step's lengths), so a CUDA graph may capture it."""
    programs = max(1, tokens * num_kv_heads)
    return max(1, min(target_programs // programs, table_blocks * block_size // MIN_PARTITION_TOKENS))


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
                    kv_scale: torch.Tensor | None = None, num_splits: int | None = None) -> torch.Tensor:
    """``num_splits``: None picks it with ``attention_splits``; an int forces it (1: the single-pass kernel)."""
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
    block_g, block_d = triton.next_power_of_2(group), triton.next_power_of_2(head_dim)
    pool_strides = (kv_cache.stride(0), kv_cache.stride(1), kv_cache.stride(2), kv_cache.stride(3), head_dim)
    walk = dict(BLOCK_SIZE=block_size, BLOCK_G=block_g, BLOCK_D=block_d, KV_FP8=kv_fp8,
                num_warps=attention_warps(group, head_dim, block_size))
    if num_splits == 1:
        paged_attention_kernel[(t, num_kv_heads)](
            q, kv_cache, out, tables, tok_seq, tok_pos, scales, scale, group,
            q.stride(0), q.stride(1), out.stride(0), out.stride(1), tables.stride(0), *pool_strides, **walk)
        return out
    part_max = torch.empty(t, num_heads, num_splits, dtype=torch.float32, device=q.device)
    part_sum = torch.empty_like(part_max)
    part_acc = torch.empty(t, num_heads, num_splits, head_dim, dtype=torch.float32, device=q.device)
    paged_attention_split_kernel[(t, num_kv_heads, num_splits)](
        q, kv_cache, part_max, part_sum, part_acc, tables, tok_seq, tok_pos, scales, scale, group, num_splits,
        q.stride(0), q.stride(1), tables.stride(0), *pool_strides, **walk)
    paged_attention_combine_kernel[(t, num_heads)](
        part_max, part_sum, part_acc, out, tok_pos, num_splits, out.stride(0), out.stride(1), head_dim,
        BLOCK_SIZE=block_size, BLOCK_S=combine_tile(num_splits), BLOCK_D=block_d, num_warps=4)
    return out


def combine_tile(num_splits: int) -> int:
    return min(triton.next_power_of_2(num_splits), COMBINE_SPLITS_TILE)


def reference_paged_attention(q, kv_cache, meta, scale, num_kv_heads, kv_scale=None):
    """Gather each sequence's K/V from its blocks (an fp8 pool: times ``kv_scale``) and run causal
    attention in float32."""
    kv_scale = torch.ones(2, device=q.device) if kv_scale is None else kv_scale.float()
    out = torch.empty_like(q)
    group = q.shape[1] // num_kv_heads
    block_size = kv_cache.shape[2]
    start = 0
    for b, (q_len, s_len) in enumerate(zip(meta.query_lens_list, meta.seq_lens_list)):
        blocks = meta.block_tables[b, : -(-s_len // block_size)].long()
        k = kv_cache[0, blocks].reshape(-1, num_kv_heads, q.shape[2])[:s_len].float() * kv_scale[0]
        v = kv_cache[1, blocks].reshape(-1, num_kv_heads, q.shape[2])[:s_len].float() * kv_scale[1]
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        qs = q[start:start + q_len].float()
        scores = torch.einsum("thd,shd->hts", qs, k) * scale
        q_pos = torch.arange(s_len - q_len, s_len, device=q.device)[:, None]
        scores = scores.masked_fill(torch.arange(s_len, device=q.device)[None, :] > q_pos, float("-inf"))
        out[start:start + q_len] = torch.einsum("hts,shd->thd", scores.softmax(-1), v).to(q.dtype)
        start += q_len
    return out


def compile_specs():
    from .compile_specs import CompileSpec, signature_of
    specs = []
    aligned = ("q_ptr", "cache_ptr", "stride_qt", "stride_qh", "stride_kv", "stride_block", "stride_slot",
               "stride_head", "head_dim")
    walks = ((3, 64, "bf16", 16, None), (4, 128, "bf16", 16, None), (8, 128, "fp16", 16, None),
             (4, 128, "bf16", 32, None), (8, 128, "bf16", 16, "fp8e4nv"),
             (4, 128, "bf16", 32, "fp8e4nv"), (3, 64, "fp16", 16, "fp8e5"))
    split_shapes = ((4, 128, "bf16", 16, None), (4, 128, "bf16", 16, "fp8e4nv"), (3, 64, "bf16", 16, None),
                    (3, 64, "fp16", 16, "fp8e5"))
    for name, fn, shapes in (("paged_attention", paged_attention_kernel, walks),
                             ("attn_split", paged_attention_split_kernel, split_shapes)):
        for group, d, dtype, bs, cache in shapes:
            constexprs = dict(BLOCK_SIZE=bs, BLOCK_G=triton.next_power_of_2(group), BLOCK_D=d, KV_FP8=cache is not None)
            types = dict(q_ptr=f"*{dtype}", cache_ptr=f"*{cache or dtype}", out_ptr=f"*{dtype}", tables_ptr="*i32",
                         tok_seq_ptr="*i32", tok_pos_ptr="*i64", kv_scale_ptr="*fp32" if cache else "*i64",
                         scale="fp32", part_max_ptr="*fp32", part_sum_ptr="*fp32", part_acc_ptr="*fp32")
            outputs = ("out_ptr", "stride_ot", "stride_oh") if fn is paged_attention_kernel else ("part_acc_ptr",)
            label = f"group={group} D={d} block={bs} {dtype}" + (f" kv={cache}" if cache else "")
            specs.append(CompileSpec(name, label, fn, signature_of(fn, types, constexprs), constexprs,
                                     attention_warps(group, d, bs), aligned + outputs))
    fn = paged_attention_combine_kernel
    for d, dtype, splits in ((128, "bf16", 32), (128, "bf16", 4), (64, "fp16", 8), (128, "fp32", 64)):
        constexprs = dict(BLOCK_SIZE=16, BLOCK_S=combine_tile(splits), BLOCK_D=d)
        types = dict(part_max_ptr="*fp32", part_sum_ptr="*fp32", part_acc_ptr="*fp32", out_ptr=f"*{dtype}",
                     tok_pos_ptr="*i64")
        specs.append(CompileSpec("attn_combine", f"D={d} {dtype} splits={splits}", fn,
                                 signature_of(fn, types, constexprs), constexprs, 4,
                                 ("part_acc_ptr", "out_ptr", "stride_ot", "stride_oh", "head_dim")))
    return specs
