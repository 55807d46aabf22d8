"""The walk both paged-attention kernels share (kernels/triton/paged_attention.py, kernels/triton/paged_attention_split.py).

A program holds one KV head's whole query group for one token: ``query_group`` loads it in float32,
times the softmax scale (and an fp8 pool's K scale, folded into the query: one multiply per query element
instead of one per key element); ``attend_blocks`` runs the online softmax over a range of the token's
table blocks, keys past its position masked, and returns the un-normalised partial (an fp8 pool's V scale
applied to the accumulator once). ``walk_constexprs`` and ``attention_warps`` size either kernel's program
for the walk's tile; ``walk_compile_specs`` builds either kernel's compile checks.

Each iteration of the walk takes a tile of ``TILE_BLOCKS`` table blocks (``TILE_TOKENS`` = 64 keys at block
sizes up to 64, one block above): the tile's table entries as one vector, K and V gathered as [tile keys, D]
tiles, the scores and the value update as two tensor-core dots (the query group padded to 16 rows), then
one online-softmax step. Walking one 16-key block per iteration, a chain of dependent loads and products
reduced through shared memory, took ~3 us a block for one program and reached only 0.18 of HBM bandwidth
even at batch 64 x 8 KV heads on an H100 (docs/gpu-runs/h100-2026-11-26); at blocks of 16 the tile moves
four times the bytes per dependent step.
"""
from __future__ import annotations

import triton
import triton.language as tl

from gh200rt.kernels.triton.compile_specs import CompileSpec, signature_of

TILE_TOKENS = 64  # keys an iteration takes, at block size 64 or less
MIN_DOT_ROWS = 16  # tl.dot's smallest tile side on tensor cores
FULL_TILE = TILE_TOKENS * 128  # keys x head dim of the tile at head dim 128, where the warps change
NO_HOST_BLOCKS = 2 ** 31 - 1  # the first host id where a step has no host blocks: past any int32 table entry


@triton.jit
def query_group(q_ptr, t, kv_head, group, head_dim, kv_scale_ptr, scale, stride_qt, stride_qh,
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
def attend_blocks(q, cache_ptr, table_ptr, kv_head, pos, first_block, end_block, kv_scale_ptr,
                   stride_kv, stride_block, stride_slot, stride_head, head_dim,
                   host_ptr, host_first, stride_host_kv, stride_host_block,
                   BLOCK_SIZE: tl.constexpr, TILE_BLOCKS: tl.constexpr, BLOCK_G: tl.constexpr,
                   BLOCK_D: tl.constexpr, KV_FP8: tl.constexpr, DOT_PRECISION: tl.constexpr,
                   HOST_BLOCKS: tl.constexpr):
    """Online softmax of the query group over table blocks [first_block, end_block), ``TILE_BLOCKS`` at a time,
    keys past ``pos`` masked: (running max, sum of exponentials, un-normalised accumulator in dequantized units).
    With ``HOST_BLOCKS`` a table entry ``host_first`` or above is block ``entry - host_first`` of the host pool at
    ``host_ptr`` (read in place; its slot and head strides are the device pool's)."""
    offs_t = tl.arange(0, TILE_BLOCKS * BLOCK_SIZE)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < head_dim
    m_i = tl.full((BLOCK_G,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((BLOCK_G,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_G, BLOCK_D), dtype=tl.float32)
    # two stages: the next tile's table entries and K/V load while this one computes (three spill at 8 warps)
    for j in tl.range(first_block, end_block, TILE_BLOCKS, num_stages=2):
        key_block = j + offs_t // BLOCK_SIZE  # each key's index in the table
        # a range may end inside the tile; the table is never read past it (a row may end there)
        in_range = key_block < end_block
        block = tl.load(table_ptr + key_block, mask=in_range, other=0).to(tl.int64)
        in_block = (offs_t % BLOCK_SIZE)[:, None] * stride_slot + kv_head * stride_head + offs_d[None, :]
        key_ok = in_range & (j * BLOCK_SIZE + offs_t <= pos)
        kv_mask = key_ok[:, None] & d_ok[None, :]
        if HOST_BLOCKS:
            # each key is read from exactly one pool; the other load is masked off and adds an exact zero
            on_host = (block >= host_first)[:, None]
            kv_off = tl.where(on_host, 0, block[:, None]) * stride_block + in_block
            host_off = tl.where(on_host, block[:, None] - host_first, 0) * stride_host_block + in_block
            k = (tl.load(cache_ptr + kv_off, mask=kv_mask & ~on_host, other=0.0).to(tl.float32)
                 + tl.load(host_ptr + host_off, mask=kv_mask & on_host, other=0.0).to(tl.float32))
            v = (tl.load(cache_ptr + stride_kv + kv_off, mask=kv_mask & ~on_host, other=0.0).to(tl.float32)
                 + tl.load(host_ptr + stride_host_kv + host_off, mask=kv_mask & on_host, other=0.0).to(tl.float32))
        else:
            kv_off = block[:, None] * stride_block + in_block
            k = tl.load(cache_ptr + kv_off, mask=kv_mask, other=0.0).to(tl.float32)
            v = tl.load(cache_ptr + stride_kv + kv_off, mask=kv_mask, other=0.0).to(tl.float32)
        scores = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
        # finite from the first tile on: its first key, block first_block's slot 0, is at or before pos
        scores = tl.where(key_ok[None, :], scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, axis=1))
        p = tl.exp(scores - m_new[:, None])
        alpha = tl.exp(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p, v, input_precision=DOT_PRECISION)
        m_i = m_new
    if KV_FP8:
        acc = acc * tl.load(kv_scale_ptr + 1)
    return m_i, l_i, acc


def tile_blocks(block_size: int) -> int:
    """Table blocks in one iteration's tile: ``TILE_TOKENS`` keys, or one block where a block holds more."""
    return max(1, TILE_TOKENS // block_size)


def walk_constexprs(group: int, head_dim: int, block_size: int, kv_fp8: bool, fp32_pool: bool,
                    host_blocks: bool = False) -> dict:
    """The walk's constexprs: the query group and head dim padded to tensor-core tiles; exact float32 dots
    where the pool holds float32 (fp32 models keep ~1e-5 parity), tf32 otherwise (~5e-4 relative in the
    scores, well under a bf16/fp16/fp8 pool's own rounding); ``host_blocks``: tables may name host blocks."""
    return dict(BLOCK_SIZE=block_size, TILE_BLOCKS=tile_blocks(block_size),
                BLOCK_G=max(MIN_DOT_ROWS, triton.next_power_of_2(group)),
                BLOCK_D=max(MIN_DOT_ROWS, triton.next_power_of_2(head_dim)), KV_FP8=kv_fp8,
                DOT_PRECISION="ieee" if fp32_pool else "tf32", HOST_BLOCKS=host_blocks)


def host_operands(kv_cache, host) -> tuple:
    """The walk's host-pool operands (pointer, first host id, K/V plane and block strides) for ``host``, a
    ``HostBlocksView`` or None (then the device pool stands in and no table entry reaches it)."""
    if host is None:
        return kv_cache, NO_HOST_BLOCKS, 0, 0
    pool = host.pool
    assert pool.dtype == kv_cache.dtype and pool.device == kv_cache.device, (pool.dtype, pool.device, kv_cache.device)
    assert pool.shape[2:] == kv_cache.shape[2:] and pool.stride()[2:] == kv_cache.stride()[2:], \
        "a host block's slots and heads are laid out as a device block's"
    assert host.first_id >= kv_cache.shape[1], "host ids start past the device pool's blocks"
    return pool, host.first_id, pool.stride(0), pool.stride(1)


def attention_warps(head_dim: int, block_size: int, fp32_pool: bool, kv_fp8: bool) -> int:
    """4 or 8 warps for the walk's [keys, head dim] tile, as scripts/check_kernels.py finds them spill-free
    (ptxas spills a few bytes where it aims at 64-128 registers a thread with the other count): exact float32
    dots keep 4 up to 64 x 128 (~150 registers) and take 8 past it; tf32 dots take 8 from 64 x 128 (~100-130
    registers) and over an fp8 pool, 4 below."""
    tile = tile_blocks(block_size) * block_size * max(MIN_DOT_ROWS, triton.next_power_of_2(head_dim))
    if fp32_pool:
        return 4 if tile <= FULL_TILE else 8
    return 8 if tile >= FULL_TILE or kv_fp8 else 4


def walk_compile_specs(name: str, fn, shapes, outputs: tuple) -> list:
    """Compile checks of a kernel that walks the pool (``fn``), one per (group, head_dim, dtype, block size,
    fp8 cache dtype, None, "PDL": the dtype's pool with programmatic dependent launch, or "host": the dtype's pool
    with host blocks) in ``shapes``; ``outputs``: its output arguments, promised 16-divisible."""
    aligned = ("q_ptr", "cache_ptr", "stride_qt", "stride_qh", "stride_kv", "stride_block", "stride_slot",
               "stride_head", "head_dim", "host_ptr", "stride_host_kv", "stride_host_block")
    specs = []
    for group, d, dtype, bs, cache in shapes:
        pdl = cache == "PDL"              # the bf16 pool, launched with programmatic dependent launch
        host = cache == "host"            # the bf16 pool, tables naming host blocks too
        cache = None if pdl or host else cache
        constexprs = dict(walk_constexprs(group, d, bs, cache is not None, (cache or dtype) == "fp32", host),
                          USE_PDL=pdl)
        types = dict(q_ptr=f"*{dtype}", cache_ptr=f"*{cache or dtype}", host_ptr=f"*{cache or dtype}",
                     out_ptr=f"*{dtype}", tables_ptr="*i32",
                     tok_seq_ptr="*i32", tok_pos_ptr="*i64", kv_scale_ptr="*fp32" if cache else "*i64",
                     scale="fp32", part_max_ptr="*fp32", part_sum_ptr="*fp32", part_acc_ptr="*fp32")
        label = f"group={group} D={d} block={bs} {dtype}" + (f" kv={cache}" if cache else "") + \
            (" PDL" if pdl else "") + (" host blocks" if host else "")
        specs.append(CompileSpec(name, label, fn, signature_of(fn, types, constexprs), constexprs,
                                 attention_warps(d, bs, (cache or dtype) == "fp32", cache is not None),
                                 aligned + outputs))
    return specs
