"""CPU paged attention per layer call: a step that mixes decodes with a prefill chunk, attended in one padded
call (every decode padded to the chunk's length, as before) against one batched call per kind (now).

    python scripts/bench_attention.py [--threads 1] [--reps 20]

SmolLM2-135M's attention shape (9 query heads, 3 KV heads, head_dim 64, blocks of 16). Prints the
fastest of --reps calls for each (the minimum is the least disturbed by other processes on a
shared machine) and whether the two agree (they differ in rounding only, max |diff| shown).
"""
from __future__ import annotations

import argparse
import time

import torch

from gh200rt.kv import attention
from gh200rt.models.base import AttentionMetadata

HEADS, KV_HEADS, HEAD_DIM, BLOCK = 9, 3, 64, 16
CASES = {"8 decodes + a 128-token chunk": ([1] * 8 + [128], [200] * 8 + [128]),
         "32 decodes + a 256-token chunk": ([1] * 32 + [256], [300] * 32 + [256]),
         "64 decodes": ([1] * 64, [130] * 64),
         "18 prompts of 114 tokens": ([114] * 18, [114] * 18)}


def one_padded_call(q, kv, meta):
    group = attention._Group(meta, list(range(meta.num_seqs)), decode=meta.is_decode_only)
    return attention._attend(q, kv, group, HEAD_DIM ** -0.5, KV_HEADS, None)


def split_calls(q, kv, meta):
    return attention.paged_attention(q, kv, meta, HEAD_DIM ** -0.5, KV_HEADS)


def fastest(fn, q, kv, query_lens, seq_lens, tables, reps: int) -> tuple[float, torch.Tensor]:
    times = []
    for _ in range(reps):
        meta = AttentionMetadata.build(query_lens, seq_lens, tables, BLOCK)  # layout built once per step
        start = time.perf_counter()
        out = fn(q, kv, meta)
        times.append(time.perf_counter() - start)
    return min(times), out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--reps", type=int, default=20)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"{'step':<32} {'dtype':<9} {'one padded call':>16} {'one call per kind':>18} {'speed-up':>9} "
          f"{'max |diff|':>10}")
    for dtype in (torch.float32, torch.bfloat16):
        for name, (query_lens, seq_lens) in CASES.items():
            gen = torch.Generator().manual_seed(0)
            tables, start = [], 0
            for s in seq_lens:
                n = -(-s // BLOCK)
                tables.append(list(range(start, start + n)))
                start += n
            kv = torch.randn(2, start, BLOCK, KV_HEADS, HEAD_DIM, generator=gen).to(dtype)
            q = torch.randn(sum(query_lens), HEADS, HEAD_DIM, generator=gen).to(dtype)
            before, want = fastest(one_padded_call, q, kv, query_lens, seq_lens, tables, args.reps)
            after, got = fastest(split_calls, q, kv, query_lens, seq_lens, tables, args.reps)
            diff = (got.float() - want.float()).abs().max().item()
            print(f"{name:<32} {str(dtype).removeprefix('torch.'):<9} {before * 1e3:13.2f} ms {after * 1e3:15.2f} ms "
                  f"{before / after:8.2f}x {diff:10.2e}")


if __name__ == "__main__":
    main()
