"""``python -m gh200rt.plan``: plan a deployment for a named hardware profile, no hardware needed.

Reads only ``config.json`` from the model directory (weights need not be present) and prints the
per-layer tiers, the staging ring, the KV capacity and the predicted decode step time. With tiers
that follow KV demand (``--offload dynamic``, or ``auto`` on a platform where streaming is cheap),
it also prints where the split settles, and the step time predicted, at several KV demands. An FP8
checkpoint (``quantization_config``, see loader/fp8_checkpoint.py) is planned as the engine places
it: resident layers keep fp8 on a GPU, and ``--host-weight-dtype auto`` keeps fp8 in host memory.
With ``--tensor-parallel-size N`` it plans one rank's shard (each rank holds as much and follows the same plan;
the device budget is per rank). With ``--speculative-config`` it prints the step's predicted cost over the tokens it
verifies and the k that pays best at a few acceptance rates (what ``num_speculative_tokens: "auto"`` starts from,
before it measures both on the running engine).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from gh200rt.cli_args import add_dataclass_arguments, dataclass_from_args
from gh200rt.config import CacheConfig, MemoryConfig, ParallelConfig, SchedulerConfig, SpeculativeConfig
from gh200rt.engine.host_kv_tier import host_available_bytes, host_tier_blocks
from gh200rt.loader.fp8_checkpoint import fp8_block_size, fp8_scheme
from gh200rt.memory.ledger import ledger_capacity
from gh200rt.models.arch_config import ArchConfig
from gh200rt.planner.cost_model import DTYPE_BYTES, activation_bytes, model_sizes, predict_step_seconds
from gh200rt.planner.layout import expert_device_bytes
from gh200rt.planner.planner import Plan, RankShare, dynamic_splits, make_plan
from gh200rt.platform.detect import detect


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gh200rt.plan", description=__doc__)
    parser.add_argument("--model", required=True, help="directory holding config.json (or the file itself)")
    parser.add_argument("--dtype", default="bf16", choices=sorted(DTYPE_BYTES),
                        help="compute dtype of resident weights and the KV cache (default: bf16)")
    parser.add_argument("--batch", type=int, default=1, help="expected decode batch for the cost model")
    add_dataclass_arguments(parser, CacheConfig, "KV cache")
    add_dataclass_arguments(parser, SchedulerConfig, "scheduler")
    add_dataclass_arguments(parser, MemoryConfig, "memory placement")
    add_dataclass_arguments(parser, ParallelConfig, "parallelism")
    add_dataclass_arguments(parser, SpeculativeConfig, "speculative decoding")
    args = parser.parse_args(argv)
    path = Path(args.model)
    path = path / "config.json" if path.is_dir() else path
    if not path.is_file():
        parser.error(f"--model {args.model}: no config.json found there")
    try:
        memory = dataclass_from_args(MemoryConfig, args)
        cache = dataclass_from_args(CacheConfig, args)
        scheduler = dataclass_from_args(SchedulerConfig, args)
        speculative = dataclass_from_args(SpeculativeConfig, args).method
        platform = detect(memory.platform, memory.profile_file)
        config = json.loads(path.read_text())
        arch = ArchConfig.from_hf_config(config)
        n = dataclass_from_args(ParallelConfig, args).tensor_parallel_size
        rank_share, vocab_rows = None, None
        if n > 1:        # one rank's part: every rank holds as much and follows the same plan
            from gh200rt.distributed.sharding import TensorShard
            shard = TensorShard(0, n, arch)
            rank_share, vocab_rows, arch = RankShare.of(arch, n), shard.vocab_size, shard.local_arch()
        fp8_weights = fp8_scheme(config, str(path))
        on_gpu = platform.kind != "cpu"
        host = memory.host_weight_dtype if memory.host_weight_dtype != "auto" else (
            "fp8" if fp8_weights and on_gpu else args.dtype)
        resident = "fp8" if fp8_weights and on_gpu else args.dtype
        block = fp8_block_size(config)
        sizes = model_sizes(arch, args.dtype, kv_dtype=cache.kv_cache_dtype, host_format=host,
                            resident_format=resident, vocab_rows=vocab_rows, fp8_group=block[1] if block else None)
        activations = activation_bytes(arch, scheduler.step_tokens(platform.kind == "cpu"), scheduler.max_num_seqs,
                                       args.dtype)
        free = None if platform.kind == "cpu" else platform.device_memory_bytes
        capacity = ledger_capacity(memory, free, sizes.all_resident_bytes + activations)
        plan = make_plan(sizes, platform, memory, capacity, cache.block_size, args.batch, activations,
                         rank_share=rank_share)
    except json.JSONDecodeError as err:
        print(f"error: {path} is not valid JSON: {err}", file=sys.stderr)
        return 2
    except KeyError as err:
        print(f"error: {path} lacks the field {err.args[0]!r}", file=sys.stderr)
        return 2
    except ValueError as err:  # includes PlanDoesNotFit
        print(f"error: {err}", file=sys.stderr)
        return 2
    kv = args.dtype if cache.kv_cache_dtype == "auto" else cache.kv_cache_dtype
    print(f"weights: resident layers {resident}, offloaded layers {host} in host memory; KV cache {kv}")
    print(plan.explain())
    problem = host_memory_problem(plan, platform, memory.platform is None, host)
    if problem is not None:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    if cache.kv_offloading_size is not None:
        try:
            print(host_tier_line(cache, sizes, plan, platform.host_numa_node if on_gpu else None))
        except ValueError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
    if speculative is not None:
        print(speculation_table(plan, args.batch, speculative.num_speculative_tokens))
    if plan.dynamic:
        print(dynamic_table(plan, args.batch))
        if n > 1:
            print(f"note: with {n} ranks, rank 0 decides each tier move and every rank makes it, into the same "
                  "arena blocks, before the same step")
    return 0


def host_memory_problem(plan: Plan, platform, local: bool, host_format: str) -> str | None:
    """Why the plan's host weights cannot fit the platform's host memory (a named profile's figure, or what this
    host has available when it plans for itself), or None. On the CPU platform every weight is in host memory
    whatever the plan, so there is nothing to compare."""
    if platform.kind == "cpu":
        return None
    limit = platform.host_memory_bytes
    where = f"{platform.profile}'s {limit / 2**30:.1f} GiB ({limit / 10**9:.0f} GB) of host memory" if limit else None
    if limit is None and local:
        limit = host_available_bytes(platform.host_numa_node)
        where = None if limit is None else f"the {limit / 2**30:.1f} GiB this host has available"
    if limit is None or plan.host_weight_bytes <= limit:
        return None
    hint = "a larger device budget, or more GPUs (--tensor-parallel-size)" if host_format == "int4-g128" else \
        "a narrower --host-weight-dtype (int8, fp8, int4, int4-g128)"
    return (f"the plan keeps {plan.host_weight_bytes / 2**30:.1f} GiB of weights in host memory ({host_format}), "
            f"more than {where}; use {hint}")


def host_tier_line(cache: CacheConfig, sizes, plan: Plan, numa_node: int | None) -> str:
    """Host memory beside the host weights: what the host KV tier (``--kv-offloading-size``) takes, as the engine
    would size it now (the weights are not placed yet: what they will take comes off what is available)."""
    block_bytes = sizes.kv_bytes_per_token * cache.block_size
    available = host_available_bytes(numa_node)
    left = None if available is None else max(0, available - plan.host_weight_bytes)
    blocks = host_tier_blocks(cache, block_bytes, left)
    return (f"host memory: weights {plan.host_weight_bytes / 2**30:.2f} GiB, KV tier {blocks * block_bytes / 2**30:.2f} "
            f"GiB ({blocks} blocks of {cache.block_size} tokens: {blocks * cache.block_size} tokens of history"
            f"{', auto' if cache.kv_offloading_auto else ''}); available now "
            + (f"{available / 2**30:.2f} GiB" if available is not None else "unknown"))


ACCEPTANCE_RATES = (0.5, 0.7, 0.9)


def speculation_table(plan: Plan, batch: int, k_max: int) -> str:
    """The predicted step over the tokens it verifies (``batch`` sequences x (1 + k)), and at each of a few
    acceptance rates (each draft kept with that chance once the one before it was) the k with the most tokens per
    second: flat where the link or HBM bandwidth bounds the step (k grows), steep where compute does."""
    def step(k: int) -> float:
        return predict_step_seconds(list(plan.tiers), plan.sizes, plan.platform, batch * (1 + k),
                                    max(plan.prefetch_distance, 1), plan.expert_tiers, plan.direct_scales_on_device)

    def rate(alpha: float, k: int) -> float:
        return batch * sum(alpha ** j for j in range(k + 1)) / step(k)

    lines = [f"speculative decoding, decode batch {batch}: predicted step by drafted tokens k (the engine measures "
             f"both the step and the acceptance as it runs)",
             "  k:       " + " ".join(f"{k:>7d}" for k in range(k_max + 1)),
             "  step ms: " + " ".join(f"{step(k) * 1e3:>7.3f}" for k in range(k_max + 1))]
    for alpha in ACCEPTANCE_RATES:
        best = max(range(k_max + 1), key=lambda k: (rate(alpha, k), -k))
        lines.append(f"  acceptance {alpha:.1f}: k = {best} pays best, {rate(alpha, best) / rate(alpha, 0):.2f}x the "
                     f"tokens per second of plain decoding")
    return "\n".join(lines)


def dynamic_table(plan: Plan, batch: int) -> str:
    """The split ``--offload dynamic`` settles on from a small KV demand up to the most the device holds."""
    sizes = plan.sizes
    # routed experts keep their start-up tiers (dynamic_splits): what is left beside them and the fixed weights
    most = (plan.capacity - plan.activation_bytes - sizes.fixed_memory - plan.layer_staging_bytes
            - expert_device_bytes(sizes, plan.expert_tiers, plan.platform)) // sizes.kv_bytes_per_token
    demands = sorted({max(plan.block_size, int(most * f)) for f in (1 / 64, 1 / 16, 1 / 8, 1 / 4, 1 / 2, 3 / 4, 1)}
                     | ({plan.all_resident_kv_tokens} if plan.all_resident_kv_tokens else set()))
    lines = [f"dynamic tiers at KV demand (decode batch {batch}):",
             f"{'KV tokens':>10} {'resident':>8} {'streamed':>8} {'step ms':>9}"]
    for row in dynamic_splits(plan, demands, batch):
        if row["fits"]:
            lines.append(f"{row['kv_tokens']:>10} {row['resident']:>8} {row['streamed']:>8} "
                         f"{row['step_seconds'] * 1e3:>9.3f}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
