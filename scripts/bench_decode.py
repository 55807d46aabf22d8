"""Decode tokens/s and achieved copy GB/s per placement and batch size (random Llama-shaped model).

Prints each placement next to the all-resident baseline measured in the same run.
Usage: python scripts/bench_decode.py [--hidden 512] [--layers 8] [--steps 16] [--batches 1,4]
"""
from __future__ import annotations

import argparse
import time

import torch

from gh200rt.config import MemoryConfig
from gh200rt.kv.pool import allocate_kv_caches
from gh200rt.memory.placement import Placement
from gh200rt.models.arch_config import ArchConfig
from gh200rt.models.base import AttentionMetadata
from gh200rt.models.llama import LlamaForCausalLM
from gh200rt.planner.cost_model import model_sizes
from gh200rt.planner.planner import make_plan
from gh200rt.platform.detect import detect

PLACEMENTS = {"resident": dict(offload="none"),
              "stream K2 d1": dict(offload="stream", staging_slots=2, prefetch_distance=1),
              "every 2nd streamed": None,
              "direct": dict(offload="direct")}


def run(arch, memory, batch, steps, block=16):
    torch.manual_seed(0)
    model = LlamaForCausalLM(arch)
    for t in model.weight_destinations().values():
        t.copy_(torch.randn_like(t) * 0.02)
    plan = make_plan(model_sizes(arch, "fp32"), detect("cpu"), MemoryConfig(**memory), 8 << 30)
    placement = Placement(plan)
    placement.apply(model)
    blocks_per_seq = -(-(steps + 1) // block)
    kv = allocate_kv_caches(arch.num_layers, batch * blocks_per_seq, block, arch.num_kv_heads, arch.head_dim,
                            torch.float32)
    tables = [list(range(b * blocks_per_seq, (b + 1) * blocks_per_seq)) for b in range(batch)]
    ids = torch.ones(batch, dtype=torch.long)
    start = time.perf_counter()
    for step in range(steps):
        meta = AttentionMetadata.build([1] * batch, [step + 1] * batch, tables, block)
        model.compute_logits(model(ids, torch.full((batch,), step), meta, kv))
    seconds = time.perf_counter() - start
    copied = placement.backend.bytes_copied if placement.backend else 0
    if placement.backend:
        placement.backend.close()
    return batch * steps / seconds, copied / seconds / 1e9


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--batches", default="1,4")
    args = parser.parse_args()
    arch = ArchConfig("llama", hidden_size=args.hidden, intermediate_size=4 * args.hidden, num_layers=args.layers,
                      num_heads=8, num_kv_heads=4, head_dim=args.hidden // 8, vocab_size=1000)
    PLACEMENTS["every 2nd streamed"] = dict(offload="none", staging_slots=2, prefetch_distance=1,
                                            layer_tiers=",".join(f"{i}:streamed" for i in range(1, args.layers, 2)))
    print(f"{'placement':<20} {'batch':>5} {'tok/s':>9} {'vs resident':>11} {'copy GB/s':>9}")
    for batch in map(int, args.batches.split(",")):
        base = None
        for name, memory in PLACEMENTS.items():
            tps, gbps = run(arch, memory, batch, args.steps)
            base = base or tps
            print(f"{name:<20} {batch:>5} {tps:>9.1f} {tps / base:>10.2f}x {gbps:>9.2f}")


if __name__ == "__main__":
    main()
