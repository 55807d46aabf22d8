"""Decode tokens/s and achieved staging-copy GB/s per weight placement and batch size.

Runs the real engine (``LLMEngine.from_config``) on whatever this machine is — CPU here, the GPU on a
GPU host — for each placement, and prints each next to the all-resident baseline measured in the
same run. Decode throughput is timed over decode-only steps (prefill excluded), after one decode step at
every batch size has run (so each batch's CUDA graph is captured before timing; a capture that still falls
inside the timed steps is printed and counted in the JSON); copy GB/s is the
bytes the transfer backend moved into staging slots over that time. The roofline is the decode rate
the platform profile's bandwidths allow for the plan's bytes per step: resident (and staged) weights
read from device memory plus direct weights read over the link, or the streamed bytes' copies, whichever
takes longer (every resident byte counts, the embedding table included: a slightly conservative bound).

    python scripts/bench_decode.py [--model smollm2-135m] [--batches 1,8] [--tokens 32]
        [--placements resident,stream,every-2nd,direct] [--host-weight-dtype auto] [--dtype auto]
        [--prefetch-across-steps on|off|both]
        [--random-model llama3-8b [--random-model-dir DIR]] [--json PATH] [--graphs]

``--graphs`` instead times the decode step (the time between tokens) eager and through the bucketed
graph path, side by side per placement and batch (each batch's bucket is captured before timing): on a
GPU the CUDA-graph speed-up, on the CPU the bucketed, padded path's overhead per step (nothing is
captured there; replay calls the same function on the persistent buffers).

``--random-model`` benchmarks a model of that exact shape with random weights written on this host
(scripts/random_checkpoint.py), so a real model size needs no download.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from gh200rt.config import EngineConfig  # noqa: E402
from gh200rt.engine.engine import LLMEngine  # noqa: E402
from gh200rt.loader.load import read_arch  # noqa: E402
from gh200rt.sampling_params import SamplingParams  # noqa: E402
from scripts.random_checkpoint import add_random_model_arguments, model_of  # noqa: E402


def placements(num_layers: int) -> dict[str, dict]:
    every = lambda g: ",".join(f"{i}:streamed" for i in range(g - 1, num_layers, g))  # noqa: E731
    return {"resident": dict(offload="none"),
            "stream": dict(offload="stream", staging_slots=2, prefetch_distance=1),
            "every-2nd": dict(offload="none", layer_tiers=every(2), staging_slots=2, prefetch_distance=1),
            "every-4th": dict(offload="none", layer_tiers=every(4), staging_slots=2, prefetch_distance=1),
            "direct": dict(offload="direct")}


@dataclass(frozen=True)
class DecodeRate:
    tokens_per_second: float
    copy_gbps: float
    copy_wait_ms_per_step: float
    captures: int            # decode graphs captured inside the timed steps (0 once warm_up ran)


def decode_rate(engine: LLMEngine, batch: int, tokens: int) -> DecodeRate:
    """Decode rate over the decode steps of ``batch`` requests of ``tokens`` new tokens each."""
    params = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
    for i in range(batch):
        engine.add_request(f"b{batch}-{i}", None, params, prompt_token_ids=[1 + i, 17, 42, 99])
    engine.step()  # prefill of every request (+ their first token)
    before = engine.stats()
    generated, steps = engine.generation_tokens, 0
    start = time.perf_counter()
    while engine.has_unfinished_requests():
        engine.step()
        steps += 1
    seconds = time.perf_counter() - start
    after = engine.stats()
    return DecodeRate((engine.generation_tokens - generated) / seconds,
                      (after.weight_bytes_copied - before.weight_bytes_copied) / seconds / 1e9,
                      (after.copy_wait_seconds - before.copy_wait_seconds) / max(steps, 1) * 1e3,
                      after.graph_captures - before.graph_captures)


def warm_up(engine: LLMEngine, batches: list[int]) -> None:
    """One decode step at every batch size the run will time: first-call costs (compiles, first touch,
    allocator) and the lazy capture of each batch's decode graph (on a GPU) stay out of the timed steps."""
    for batch in batches:
        decode_rate(engine, batch, 2)


def step_ms(engine: LLMEngine, batch: int, tokens: int, prompts: list[list[int]] | None = None) -> float:
    """Median decode-step time in ms (the time between tokens) of ``batch`` requests of ``tokens`` tokens
    (``prompts``: one per request, default four tokens each; together they must fit one step's token budget)."""
    params = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
    for i in range(batch):
        prompt = prompts[i] if prompts is not None else [1 + i, 17, 42, 99]
        engine.add_request(f"t{batch}-{i}", None, params, prompt_token_ids=prompt)
    engine.step()  # prefill of every request (+ their first token)
    times = []
    while engine.has_unfinished_requests():
        start = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def run_graphs(args) -> None:
    print(f"load average {os.getloadavg()[0]:.2f}; model {args.model}; dtype {args.dtype}")
    print(f"{'placement':<10} {'tiers (res/str/dir)':<20} {'batch':>5} {'bucket':>6} {'eager ms':>9} "
          f"{'graphs ms':>9} {'speed-up':>8} {'overhead ms':>11} {'captures':>8} {'pool MiB':>8}")
    layers = read_arch(args.model).num_layers
    rows = []
    for name in args.placements.split(","):
        engines = {}
        for graphs in (False, True):
            config = EngineConfig.from_kwargs(model=args.model, dtype=args.dtype, max_model_len=256,
                                              num_kv_blocks=256, host_weight_dtype=args.host_weight_dtype,
                                              enforce_eager=not graphs, **placements(layers)[name])
            engines[graphs] = LLMEngine.from_config(config)
        eager, bucketed = engines[False], engines[True]
        tiers = eager.stats().layers_per_tier
        label = f"{tiers.get('resident', 0)}/{tiers.get('streamed', 0)}/{tiers.get('direct', 0)}"
        for batch in map(int, args.batches.split(",")):
            for engine in engines.values():
                step_ms(engine, batch, 3)       # warm-up; captures this batch's bucket
            # alternate the two, so load from other processes falls on both alike
            times = {False: [], True: []}
            for _ in range(3):
                for graphs, engine in engines.items():
                    times[graphs].append(step_ms(engine, batch, args.tokens))
            t_eager, t_graphs = min(times[False]), min(times[True])
            graphs = bucketed.graphs
            bucket = min((b for b in graphs.buckets if b >= batch), default=batch)
            print(f"{name:<10} {label:<20} {batch:>5} {bucket:>6} {t_eager:>9.3f} {t_graphs:>9.3f} "
                  f"{t_eager / t_graphs:>7.2f}x {t_graphs - t_eager:>11.3f} {graphs.captures:>8} "
                  f"{graphs.pool_bytes / 2**20:>8.1f}", flush=True)
            rows.append(dict(placement=name, tiers=label, batch=batch, bucket=bucket, eager_ms=t_eager,
                             graphs_ms=t_graphs, speedup=t_eager / t_graphs, captures=graphs.captures,
                             graph_pool_bytes=graphs.pool_bytes, device=bucketed.runner.device))
        for engine in engines.values():
            engine.close()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(model=args.random_model or args.model, rows=rows), f, indent=1)


def roofline_tokens_per_second(engine: LLMEngine, batch: int) -> float:
    """Decode tokens/s allowed by the platform profile's bandwidths for the plan's weight bytes per step."""
    plan, platform = engine.plan, engine.platform
    layer = plan.sizes.host_layer_bytes
    streamed, direct = plan.tiers.count("streamed") * layer, plan.tiers.count("direct") * layer
    compute = ((plan.resident_weight_bytes + streamed) / (platform.hbm_gbps * 1e9)
               + direct / (platform.direct_read_gbps * 1e9))
    step = max(compute, streamed / (platform.link_h2d_gbps * 1e9))
    return batch / step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--tokens", type=int, default=32, help="decode tokens per request")
    parser.add_argument("--placements", default="resident,stream,every-2nd,every-4th,direct")
    parser.add_argument("--host-weight-dtype", default="auto")
    parser.add_argument("--prefetch-across-steps", default="on", choices=["on", "off", "both"],
                        help="'both' runs every placement with a streamed layer twice, without and with the "
                             "next step's first copies issued in the tail of this one")
    add_random_model_arguments(parser)
    parser.add_argument("--json", help="also write every row, with its roofline, to this JSON file")
    parser.add_argument("--graphs", action="store_true",
                        help="time decode steps eager vs the bucketed graph path (see above)")
    args = parser.parse_args()
    with model_of(args) as args.model:
        (run_graphs if args.graphs else run)(args)


def run(args) -> None:
    print(f"load average {os.getloadavg()[0]:.2f}; model {args.model}; host weight dtype {args.host_weight_dtype}")
    print(f"{'placement':<10} {'tiers (res/str/dir)':<20} {'across':>6} {'batch':>5} {'tok/s':>9} "
          f"{'vs resident':>11} {'copy GB/s':>9} {'wait ms/step':>12} {'roofline tok/s':>14}")
    layers = read_arch(args.model).num_layers
    baseline: dict[int, float] = {}
    rows = []
    across = {"on": [True], "off": [False], "both": [False, True]}[args.prefetch_across_steps]
    for name in args.placements.split(","):
        for wrap in across:
            config = EngineConfig.from_kwargs(model=args.model, dtype=args.dtype, max_model_len=256,
                                              num_kv_blocks=256, host_weight_dtype=args.host_weight_dtype,
                                              prefetch_across_steps=wrap, **placements(layers)[name])
            engine = LLMEngine.from_config(config)
            tiers = engine.stats().layers_per_tier
            if not tiers.get("streamed") and wrap is not across[-1]:
                engine.close()           # nothing streams: one row is enough
                continue
            label = f"{tiers.get('resident', 0)}/{tiers.get('streamed', 0)}/{tiers.get('direct', 0)}"
            batches = [int(b) for b in args.batches.split(",")]
            warm_up(engine, batches)
            for batch in batches:
                rate = decode_rate(engine, batch, args.tokens)
                tps = rate.tokens_per_second
                baseline.setdefault(batch, tps)
                roof = roofline_tokens_per_second(engine, batch)
                print(f"{name:<10} {label:<20} {'on' if wrap else 'off':>6} {batch:>5} {tps:>9.1f} "
                      f"{tps / baseline[batch]:>10.2f}x {rate.copy_gbps:>9.2f} {rate.copy_wait_ms_per_step:>12.3f} "
                      f"{roof:>14.1f}" + (f"  ({rate.captures} graph capture(s) inside the timed steps)"
                                          if rate.captures else ""), flush=True)
                rows.append(dict(placement=name, tiers=label, prefetch_across_steps=wrap, batch=batch,
                                 tokens_per_second=tps, vs_resident=tps / baseline[batch], copy_gbps=rate.copy_gbps,
                                 roofline_tokens_per_second=roof, copy_wait_ms_per_step=rate.copy_wait_ms_per_step,
                                 graph_captures_timed=rate.captures))
            engine.close()
    if args.json:
        platform = engine.platform
        with open(args.json, "w") as f:
            json.dump(dict(model=args.random_model or args.model, platform=platform.profile,
                           device=platform.device_name, hbm_gbps=platform.hbm_gbps,
                           link_h2d_gbps=platform.link_h2d_gbps, direct_read_gbps=platform.direct_read_gbps,
                           rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
