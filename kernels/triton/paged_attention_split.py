"""Split-K (flash-decoding) paged attention: the route ``paged_attention`` (kernels/triton/paged_attention.py) takes
when a token's context is cut into ``num_splits`` S > 1 shares.

The grid is (token, KV head, split): split ``s`` walks the ``s``-th of S contiguous, equal shares of the
token's own context blocks, each share at least one walk tile (kernels/triton/paged_attention_walk.py), and writes
its un-normalised float32 partial (max, sum, accumulator); a second kernel combines a token's splits per
query head with the usual rescaling. The shares are cut on the device from the token's own length, whatever
the block table's padded width, so the grid depends on shapes only: a CUDA graph captured once replays
correctly with new lengths and tables. A split whose share is empty (a context shorter than S tiles leaves
some) exits at once and the combine skips it. S = 1 is the single-pass kernel alone, with no scratch and no
combine.

``attention_splits`` picks S when the caller does not: decode at small batch gives tokens x KV heads
programs, far fewer than the ``TARGET_PROGRAMS`` a Hopper GPU keeps resident (Llama-3-8B at batch 1:
8 programs on 132 SMs), so each program's serial walk over the context bounds the step. Splitting
multiplies the programs up to that target, but never cuts the longest context the table can hold
into shares under ``MIN_PARTITION_TOKENS``: a shorter share would spend more on its partial's write
and combine than its parallelism saves. Batch 64 x 8 KV heads already fills the target, so it keeps
one split and pays no combine. This is a first guess to be tuned by measurement
(python -m gh200rt.bench kernel gpu-attention).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from gh200rt.kernels.triton.compile_specs import CompileSpec, signature_of
from gh200rt.kernels.triton.host_gemm import TARGET_PROGRAMS
from gh200rt.kernels.triton.paged_attention_walk import attend_blocks, query_group, tile_blocks, walk_compile_specs
from gh200rt.kernels.triton.pdl import allow_next, pdl_launch, wait_for_previous

MIN_PARTITION_TOKENS = 256
COMBINE_SPLITS_TILE = 32  # splits the combine loads per step: a [32, D] float32 tile


@triton.jit
def _split_share(pos, split, num_splits, BLOCK_SIZE: tl.constexpr, TILE_BLOCKS: tl.constexpr):
    """(first block, end block, splits with work) of ``split``'s share of a token at ``pos``: an S-th of its
    blocks, but at least one walk tile, so a short context leaves splits empty rather than each walking a
    tile that is mostly masked."""
    blocks = pos // BLOCK_SIZE + 1
    per_split = tl.maximum(tl.cdiv(blocks, num_splits), TILE_BLOCKS)
    first = split * per_split
    return first, tl.minimum(first + per_split, blocks), tl.cdiv(blocks, per_split)


@triton.jit
def paged_attention_split_kernel(q_ptr, cache_ptr, part_max_ptr, part_sum_ptr, part_acc_ptr, tables_ptr,
                                 tok_seq_ptr, tok_pos_ptr, kv_scale_ptr, scale, group, num_splits,
                                 stride_qt, stride_qh, stride_table,
                                 stride_kv, stride_block, stride_slot, stride_head, head_dim,
                                 host_ptr, host_first, stride_host_kv, stride_host_block,
                                 BLOCK_SIZE: tl.constexpr, TILE_BLOCKS: tl.constexpr, BLOCK_G: tl.constexpr,
                                 BLOCK_D: tl.constexpr, KV_FP8: tl.constexpr, DOT_PRECISION: tl.constexpr,
                                 HOST_BLOCKS: tl.constexpr, USE_PDL: tl.constexpr):
    """One split's partial into part_*[T, Hq, S] (max, sum) and part_acc[T, Hq, S, D], all float32."""
    t, kv_head, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    wait_for_previous(USE_PDL)
    pos = tl.load(tok_pos_ptr + t)
    first, end, _ = _split_share(pos, split, num_splits, BLOCK_SIZE, TILE_BLOCKS)
    if first >= end:
        return
    seq = tl.load(tok_seq_ptr + t)
    q, q_heads, g_ok, offs_d, d_ok = query_group(q_ptr, t, kv_head, group, head_dim, kv_scale_ptr, scale,
                                                  stride_qt, stride_qh, BLOCK_G, BLOCK_D, KV_FP8)
    m_i, l_i, acc = attend_blocks(q, cache_ptr, tables_ptr + seq * stride_table, kv_head, pos, first, end,
                                   kv_scale_ptr, stride_kv, stride_block, stride_slot, stride_head, head_dim,
                                   host_ptr, host_first, stride_host_kv, stride_host_block,
                                   BLOCK_SIZE, TILE_BLOCKS, BLOCK_G, BLOCK_D, KV_FP8, DOT_PRECISION, HOST_BLOCKS)
    allow_next(USE_PDL)
    rows = (t.to(tl.int64) * tl.num_programs(1) * group + q_heads) * num_splits + split
    tl.store(part_max_ptr + rows, m_i, mask=g_ok)
    tl.store(part_sum_ptr + rows, l_i, mask=g_ok)
    tl.store(part_acc_ptr + rows[:, None] * head_dim + offs_d[None, :], acc, mask=g_ok[:, None] & d_ok[None, :])


@triton.jit
def paged_attention_combine_kernel(part_max_ptr, part_sum_ptr, part_acc_ptr, out_ptr, tok_pos_ptr, num_splits,
                                   stride_ot, stride_oh, head_dim,
                                   BLOCK_SIZE: tl.constexpr, TILE_BLOCKS: tl.constexpr, BLOCK_S: tl.constexpr,
                                   BLOCK_D: tl.constexpr, USE_PDL: tl.constexpr):
    """out[t, head] from the splits with work: each partial rescaled to the common max, summed, normalised."""
    t, head = tl.program_id(0), tl.program_id(1)
    wait_for_previous(USE_PDL)
    allow_next(USE_PDL)     # one short pass over the partials
    pos = tl.load(tok_pos_ptr + t)
    _, _, with_work = _split_share(pos, 0, num_splits, BLOCK_SIZE, TILE_BLOCKS)
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


def attention_splits(tokens: int, num_kv_heads: int, table_blocks: int, block_size: int,
                     target_programs: int = TARGET_PROGRAMS) -> int:
    """Splits of each token's context: enough to bring tokens x KV heads programs up to ``target_programs``,
    as long as the longest context the table holds keeps shares of ``MIN_PARTITION_TOKENS`` or more, and of
    one walk tile or more (64 keys, or one block where blocks are larger: it binds only at blocks over 256
    slots). A split walks whole tiles and the device cuts shares of at least one, so a split count asking
    for less would only launch programs that find their share empty.
    Host ints only (the table's padded width, never the step's lengths), so a CUDA graph may capture it."""
    programs = max(1, tokens * num_kv_heads)
    min_share = max(MIN_PARTITION_TOKENS, tile_blocks(block_size) * block_size)
    return max(1, min(target_programs // programs, table_blocks * block_size // min_share))


def combine_tile(num_splits: int) -> int:
    return min(triton.next_power_of_2(num_splits), COMBINE_SPLITS_TILE)


def split_paged_attention(q: torch.Tensor, kv_cache: torch.Tensor, out: torch.Tensor, tables: torch.Tensor,
                          tok_seq: torch.Tensor, tok_pos: torch.Tensor, scales: torch.Tensor, scale: float,
                          group: int, num_splits: int, pool_operands: tuple, walk: dict) -> torch.Tensor:
    """``out`` from ``num_splits`` partials per token and their combine: ``paged_attention``'s operands as it
    prepared them (``pool_operands``: the pools' strides and host operands; ``walk``: the walk's constexprs and
    warps)."""
    t, num_heads, head_dim = q.shape
    part_max = torch.empty(t, num_heads, num_splits, dtype=torch.float32, device=q.device)
    part_sum = torch.empty_like(part_max)
    part_acc = torch.empty(t, num_heads, num_splits, head_dim, dtype=torch.float32, device=q.device)
    paged_attention_split_kernel[(t, kv_cache.shape[3], num_splits)](
        q, kv_cache, part_max, part_sum, part_acc, tables, tok_seq, tok_pos, scales, scale, group, num_splits,
        q.stride(0), q.stride(1), tables.stride(0), *pool_operands, **walk)
    pdl = walk["USE_PDL"]
    paged_attention_combine_kernel[(t, num_heads)](
        part_max, part_sum, part_acc, out, tok_pos, num_splits, out.stride(0), out.stride(1), head_dim,
        BLOCK_SIZE=walk["BLOCK_SIZE"], TILE_BLOCKS=walk["TILE_BLOCKS"], BLOCK_S=combine_tile(num_splits),
        BLOCK_D=walk["BLOCK_D"], USE_PDL=pdl, num_warps=4, **pdl_launch(pdl))
    return out


def compile_specs():
    split_shapes = ((4, 128, "bf16", 16, None), (4, 128, "bf16", 16, "fp8e4nv"), (3, 64, "bf16", 16, None),
                    (3, 64, "fp16", 16, "fp8e5"), (4, 128, "fp32", 16, None), (4, 128, "bf16", 16, "PDL"),
                    (4, 128, "bf16", 16, "host"))
    specs = walk_compile_specs("attn_split", paged_attention_split_kernel, split_shapes, ("part_acc_ptr",))
    fn = paged_attention_combine_kernel
    for d, dtype, splits, pdl in ((128, "bf16", 32, False), (128, "bf16", 4, False), (64, "fp16", 8, False),
                                  (128, "fp32", 64, False), (128, "bf16", 32, True)):
        constexprs = dict(BLOCK_SIZE=16, TILE_BLOCKS=tile_blocks(16), BLOCK_S=combine_tile(splits), BLOCK_D=d,
                          USE_PDL=pdl)
        types = dict(part_max_ptr="*fp32", part_sum_ptr="*fp32", part_acc_ptr="*fp32", out_ptr=f"*{dtype}",
                     tok_pos_ptr="*i64")
        specs.append(CompileSpec("attn_combine", f"D={d} {dtype} splits={splits}" + (" PDL" if pdl else ""), fn,
                                 signature_of(fn, types, constexprs), constexprs, 4,
                                 ("part_acc_ptr", "out_ptr", "stride_ot", "stride_oh", "head_dim")))
    return specs
