"""Paged decode attention on a CUDA GPU: the Triton kernel with the split count it chooses, against one split
(the single pass, the baseline) and FlashInfer's paged decode where ``import flashinfer`` works, each next to
the HBM bandwidth a large device-to-device copy reaches in the same run. FlashInfer may compile its kernel at the first call of a row, outside the timing.

    python -m gh200rt.bench kernel gpu-attention [--batches 1,8,32,64] [--contexts 512,2048,8192]
        [--table-tokens 0] [--warmup-ms 10] [--rep-ms 40] [--baseline REV|DIR] [--json PATH]

``--baseline`` adds another tree's kernel (a git revision, or a directory holding its ``kernels/`` files, for a
copy of the tree without git history: ``git archive REV kernels | tar -x -C DIR/..``), one split and its own
split choice, timed in the same run: the before of a kernel change. Without it, ``.baseline/attention/kernels``
is used where it holds a ``paged_attention.py`` (under ``triton/`` or not).

Llama-3-8B's decode shape: 32 query heads, 8 KV heads, head_dim 128, bf16 K/V in blocks of 16; every
sequence of a row holds ``context`` tokens in blocks scattered through one pool sized for the largest row.
Times are ``triton.testing.do_bench`` medians of one layer's call (the step's token layout built by an
earlier call, as layer 0 builds it for the others). "KV MB" is the K and V bytes the step must read;
GB/s is that over the time, and "of HBM" its fraction of the copy's bandwidth (read + write bytes).
``--table-tokens N`` pads every block table to N tokens, the width a CUDA graph sized for
``max_model_len = N`` sees: the split count follows the table's width, not the lengths.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch

from gh200rt.bench import baseline

HEADS, KV_HEADS, HEAD_DIM, BLOCK, DTYPE = 32, 8, 128, 16, torch.bfloat16
COPY_BYTES = 1 << 30
BASELINE_DIR = baseline.CHECKOUT / ".baseline" / "attention" / "kernels"


def default_baseline() -> str | None:
    """``BASELINE_DIR`` where it holds a paged_attention.py (a tree that travelled without git history), else None."""
    return str(BASELINE_DIR) if baseline.holds_kernels(BASELINE_DIR, ("paged_attention",)) else None


def require_cuda() -> None:
    if not torch.cuda.is_available():
        raise SystemExit("kernel gpu-attention measures compiled kernels on a CUDA GPU; this machine has none "
                         "(the kernels' correctness on the CPU is tests/kernels/test_split_attention.py)")
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        raise SystemExit("TRITON_INTERPRET is set: Triton would interpret the kernels; unset it to benchmark them")


def hbm_copy_gbps(bench) -> float:
    src = torch.empty(COPY_BYTES, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = bench(lambda: dst.copy_(src))
    return 2 * COPY_BYTES / ms / 1e6


def decode_step(pool_blocks: int, batch: int, context: int, table_tokens: int, gen: torch.Generator):
    """(q, meta): ``batch`` decodes at ``context`` over blocks drawn at random from the pool (0 is padding)."""
    from gh200rt.models.base import AttentionMetadata
    needed = -(-context // BLOCK)
    width = max(needed, -(-table_tokens // BLOCK))
    ids = (torch.randperm(pool_blocks - 1, generator=gen)[:batch * needed] + 1).view(batch, needed)
    tables = [row + [0] * (width - needed) for row in ids.tolist()]
    meta = AttentionMetadata.build([1] * batch, [context] * batch, tables, BLOCK, "cuda")
    q = torch.randn(batch, HEADS, HEAD_DIM, generator=gen).to(device="cuda", dtype=DTYPE)
    return q, meta


def flashinfer_decode(pool: torch.Tensor, meta, batch: int, context: int):
    """FlashInfer's paged decode over the same pool and tables, or None where it does not import."""
    try:
        import flashinfer
    except ImportError:
        return None
    needed = -(-context // BLOCK)
    indices = meta.block_tables[:, :needed].reshape(-1).contiguous()
    indptr = torch.arange(0, batch * needed + 1, needed, dtype=torch.int32, device="cuda")
    last = torch.full((batch,), context - (needed - 1) * BLOCK, dtype=torch.int32, device="cuda")
    workspace = torch.empty(128 << 20, dtype=torch.uint8, device="cuda")
    wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD")
    plan = getattr(wrapper, "plan", None) or wrapper.begin_forward  # begin_forward: releases before 0.2
    run = getattr(wrapper, "run", None) or wrapper.forward
    plan(indptr, indices, last, HEADS, KV_HEADS, HEAD_DIM, BLOCK, data_type=DTYPE)
    kv = (pool[0], pool[1])
    return lambda q: run(q, kv)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--batches", default="1,8,32,64")
    parser.add_argument("--contexts", default="512,2048,8192", help="tokens per sequence")
    parser.add_argument("--table-tokens", type=int, default=0,
                        help="pad block tables to this many tokens (a graph's max_model_len); 0: the context")
    parser.add_argument("--warmup-ms", type=float, default=10)
    parser.add_argument("--rep-ms", type=float, default=40)
    parser.add_argument("--baseline", help="git revision or kernels/ directory of a kernel to time beside this one")
    parser.add_argument("--json", help="also write every row to this JSON file")


def run(args) -> int:
    require_cuda()
    import triton.testing

    from gh200rt.kernels.triton.paged_attention import attention_splits, paged_attention
    baseline_kernel, rev = None, args.baseline or default_baseline()
    if rev is not None:
        baseline_kernel = baseline.kernel_module(baseline.kernels_package(rev), "paged_attention").paged_attention
        print(f"baseline kernel: {rev}")
    batches = [int(b) for b in args.batches.split(",")]
    contexts = [int(c) for c in args.contexts.split(",")]
    bench = lambda fn: triton.testing.do_bench(fn, warmup=args.warmup_ms, rep=args.rep_ms)  # noqa: E731
    copy_gbps = hbm_copy_gbps(bench)
    device = torch.cuda.get_device_name()
    print(f"{device}: device-to-device copy {copy_gbps:.0f} GB/s (read + write), the HBM bound below")
    pool_blocks = max(batches) * -(-max(contexts) // BLOCK) + 1
    gen = torch.Generator().manual_seed(0)
    pool = torch.randn(2, pool_blocks, BLOCK, KV_HEADS, HEAD_DIM, device="cuda", dtype=DTYPE)
    scale = HEAD_DIM ** -0.5
    print(f"{'batch':>5} {'context':>7} {'splits':>6} {'KV MB':>8} {'route':<16} {'ms':>8} {'GB/s':>7} "
          f"{'of HBM':>6} {'vs 1 split':>10} {'max |diff|':>10}")
    rows = []
    for batch in batches:
        for context in contexts:
            q, meta = decode_step(pool_blocks, batch, context, args.table_tokens, gen)
            splits = attention_splits(batch, KV_HEADS, meta.block_tables.shape[1], BLOCK)
            kv_bytes = batch * context * KV_HEADS * HEAD_DIM * 2 * DTYPE.itemsize
            single = paged_attention(q, pool, meta, scale, KV_HEADS, num_splits=1)  # builds the layout, compiles
            routes = {"1 split": lambda: paged_attention(q, pool, meta, scale, KV_HEADS, num_splits=1),
                      "auto": lambda: paged_attention(q, pool, meta, scale, KV_HEADS)}
            if baseline_kernel is not None:
                routes["baseline 1 split"] = lambda: baseline_kernel(q, pool, meta, scale, KV_HEADS, num_splits=1)
                routes["baseline auto"] = lambda: baseline_kernel(q, pool, meta, scale, KV_HEADS)
            reference_decode = flashinfer_decode(pool, meta, batch, context)
            if reference_decode is not None:
                routes["flashinfer"] = lambda: reference_decode(q)
            baseline_ms = None
            for route, fn in routes.items():
                diff = (fn().float() - single.float()).abs().max().item()
                ms = bench(fn)
                baseline_ms = baseline_ms or ms
                gbps = kv_bytes / ms / 1e6
                route_splits = {"1 split": 1, "auto": splits}.get(route)
                row = dict(batch=batch, context=context, table_tokens=meta.block_tables.shape[1] * BLOCK,
                           splits=route_splits, route=route,
                           ms=ms, kv_bytes=kv_bytes, gbps=gbps, hbm_fraction=gbps / copy_gbps,
                           speedup=baseline_ms / ms, max_diff=diff)
                rows.append(row)
                print(f"{batch:>5} {context:>7} {route_splits or '-':>6} {kv_bytes / 1e6:>8.1f} {route:<16} {ms:>8.4f} "
                      f"{gbps:>7.0f} {gbps / copy_gbps:>6.2f} {baseline_ms / ms:>9.2f}x {diff:>10.2e}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(device=device, copy_gbps=copy_gbps, shape=dict(heads=HEADS, kv_heads=KV_HEADS,
                      head_dim=HEAD_DIM, block_size=BLOCK, dtype=str(DTYPE)), argv=sys.argv[1:], rows=rows), f, indent=1)
    return 0
