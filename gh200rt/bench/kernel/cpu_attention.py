"""CPU paged attention per layer call, against a baseline measured in the same run (calls alternated).

    python -m gh200rt.bench kernel cpu-attention [--threads 1] [--reps 20] [--only TEXT]
                                                 [--baseline padded | torch | native:DIR | PATH]

``--baseline padded`` (default): every step attended in one padded call (each decode padded to a prefill
chunk's length, as before the split per kind) against one batched call per kind (now).
``--baseline PATH``: the ``paged_attention`` of another version of ``gh200rt/kv/attention.py``, e.g.
``git show REV:gh200rt/kv/attention.py > /tmp/attention_rev.py``, against this tree's.
``--baseline torch``: this tree's torch attention (gather + SDPA) against the native CPU kernels as the model
calls them (``backends/cpu/ops.py``: decode and multi-token groups in ``kernels/cpu/decode_attention.c`` and
``extend_attention.c``, multi-token groups past ``EXTEND_MAX_KEYS`` keys left to SDPA).
``--baseline native:DIR``: the native kernels built from another version's ``kernels/cpu`` sources (every ``.c``
file in DIR) against this tree's, both as the model calls them, e.g. ``mkdir /tmp/base && git archive REV
kernels/cpu | tar -x -C /tmp/base`` then ``--baseline native:/tmp/base/kernels/cpu``. ``--only TEXT`` keeps the
cases whose name contains TEXT.

SmolLM2-135M's attention shape (9 query heads, 3 KV heads, head_dim 64, blocks of 16), the pool a
strided view of a block-major arena as in the engine (kv/arena.py). Prints the median of --reps calls
(each on a fresh step layout, built by a first call as layer 0 would) and whether the two agree.
"""
from __future__ import annotations

import argparse
import time

import torch

from gh200rt.bench import baseline as baselines
from gh200rt.bench.rounds import alternate
from gh200rt.kv import attention
from gh200rt.models.base import AttentionMetadata

HEADS, KV_HEADS, HEAD_DIM, BLOCK, ARENA_LAYERS = 9, 3, 64, 16, 4
CASES = {"8 decodes + a 128-token chunk": ([1] * 8 + [128], [200] * 8 + [128]),
         "32 decodes + a 256-token chunk": ([1] * 32 + [256], [300] * 32 + [256]),
         "64 decodes": ([1] * 64, [130] * 64),
         "18 prompts of 114 tokens": ([114] * 18, [114] * 18)}
# decode steps at batch 1, 8 and 32 with contexts of 128-1024 (lengths spread over a block), and prompts
CASES.update({f"{b} decodes, context ~{c}": ([1] * b, [c - (i * 5) % 11 for i in range(b)])
              for b in (1, 8, 32) for c in (128, 512, 1024)})
CASES.update({"8 prompts of 128 tokens": ([128] * 8, [128] * 8),
              "8 prompts of 65-128 tokens": ([128 - 9 * i for i in range(8)], [128 - 9 * i for i in range(8)]),
              "1 prompt of 512 tokens": ([512], [512]),
              "1 prompt of 1024 tokens": ([1024], [1024]),
              "1 prompt of 2048 tokens": ([2048], [2048]),
              "8 chunks of 64 after 64 cached": ([64] * 8, [128] * 8)})


def one_padded_call(q, kv, meta):
    group = attention._Group(meta, list(range(meta.num_seqs)), decode=meta.is_decode_only)
    return attention._attend(q, kv, group, HEAD_DIM ** -0.5, KV_HEADS, None)


def this_tree(q, kv, meta):
    return attention.paged_attention(q, kv, meta, HEAD_DIM ** -0.5, KV_HEADS)


def baseline_file(path: str):
    module = baselines.module_file(path, "baseline_attention")
    return lambda q, kv, meta: module.paged_attention(q, kv, meta, HEAD_DIM ** -0.5, KV_HEADS)


def alternated(fns, q, kv, query_lens, seq_lens, tables, reps: int) -> list[tuple[float, torch.Tensor]]:
    """Median seconds per call of each fn (calls alternated) and its last output."""
    def one_call(fn):
        def measure(_round):
            meta = AttentionMetadata.build(query_lens, seq_lens, tables, BLOCK)
            fn(q, kv, meta)  # layer 0 builds the step's layout; the other layers reuse it
            start = time.perf_counter()
            out = fn(q, kv, meta)
            return time.perf_counter() - start, out
        return measure
    results = alternate({i: one_call(fn) for i, fn in enumerate(fns)}, reps)
    return [(sorted(t for t, _ in runs)[len(runs) // 2], runs[-1][1]) for runs in results.values()]


def native_kernels(source_dir: str | None = None):
    """The native attention hook, of this tree or built from the C sources in ``source_dir``."""
    from gh200rt.backends.cpu import native
    from gh200rt.backends.cpu.ops import native_cpu_ops
    if source_dir is None:
        ops = native.load_native_ops()
        if ops is None:
            raise SystemExit(f"native CPU ops unavailable: {native.native_ops_error()}")
    else:
        ops = baselines.native_library(source_dir)
    attend = native_cpu_ops(ops)["attention"]
    return lambda q, kv, meta: attend(q, kv, meta, HEAD_DIM ** -0.5, KV_HEADS)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--baseline", default="padded",
                        help="'padded', 'torch' (against the native kernels) or the path of another version of "
                             "gh200rt/kv/attention.py, or 'native:DIR' (native kernels built from DIR's C sources "
                             "against this tree's)")
    parser.add_argument("--only", default="", help="run the cases whose name contains this text")


def run(args) -> int:
    torch.set_num_threads(args.threads)
    current = this_tree
    if args.baseline == "padded":
        baseline, label = one_padded_call, "one padded call"
    elif args.baseline == "torch":
        baseline, label, current = this_tree, "torch (SDPA)", native_kernels()
    elif args.baseline.startswith("native:"):
        baseline, label, current = native_kernels(args.baseline.removeprefix("native:")), "baseline", native_kernels()
    else:
        baseline, label = baseline_file(args.baseline), "baseline"
    name = "native" if current is not this_tree else "this tree"
    print(f"{'step':<32} {'dtype':<9} {label:>16} {name:>12} {'speed-up':>9} {'max |diff|':>10}")
    for dtype in (torch.float32, torch.bfloat16):
        for name, (query_lens, seq_lens) in CASES.items():
            if args.only not in name:
                continue
            gen = torch.Generator().manual_seed(0)
            needed = [-(-s // BLOCK) for s in seq_lens]
            ids = (torch.randperm(sum(needed), generator=gen) + 1).tolist()  # scattered blocks, 0 unused
            tables = [ids[sum(needed[:b]):sum(needed[:b + 1])] for b in range(len(needed))]
            arena = torch.randn(sum(needed) + 1, ARENA_LAYERS, 2, BLOCK, KV_HEADS, HEAD_DIM, generator=gen).to(dtype)
            kv = arena[:, 1].transpose(0, 1)  # layer 1's [2, blocks, ...] view, as kv/arena.py lays it out
            q = torch.randn(sum(query_lens), HEADS, HEAD_DIM, generator=gen).to(dtype)
            (before, want), (after, got) = alternated([baseline, current], q, kv, query_lens, seq_lens, tables,
                                                      args.reps)
            diff = (got.float() - want.float()).abs().max().item()
            print(f"{name:<32} {str(dtype).removeprefix('torch.'):<9} {before * 1e3:13.3f} ms {after * 1e3:9.3f} ms "
                  f"{before / after:8.2f}x {diff:10.2e}")
    return 0
