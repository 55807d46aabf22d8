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
``kernels/step``: what one decode step launches (on a GPU the profiler's device kernels and copies, CUDA-graph
replays included; elsewhere the torch ops and Triton launches the step issues, gh200rt/launch_count.py).
``--kernel-times N`` adds, on a GPU, that profiled step's device busy time against the span from its first
kernel to its last (the rest is the device waiting: launch gaps, host work) and its N costliest kernels;
``--host-profile N`` the N host functions with the most own time per decode step (cProfile; any machine).

    python scripts/bench_decode.py [--model smollm2-135m] [--batches 1,8] [--tokens 32]
        [--placements resident,stream,every-2nd,direct] [--host-weight-dtype auto] [--dtype auto]
        [--prefetch-across-steps on|off|both] [--layer-path one-call|op-by-op|both] [--fused-decode-rows N]
        [--pdl off|on|both] [--async-scheduling off|on|both] [--context N]
        [--random-model llama3-8b [--random-model-dir DIR]] [--json PATH] [--kernel-times N] [--host-profile N]
        [--graphs]

``--async-scheduling on`` launches each decode step before the previous step's tokens reach the host
(engine/run_ahead.py: the host's per-step work overlaps the device's); ``both`` runs each placement twice, the
synchronous engine first (the baseline in the same run). With it, a ``--kernel-times`` profile of one ``step()``
holds the step that call launches (the one it reports has run before the profile starts).

``--context N`` gives each request a prompt of N tokens (default 4), prefilled in as many steps as the token
budget takes before the decode steps are timed; the roofline then adds the K/V bytes each step's attention reads
at the average position of the timed steps.

``--graphs`` instead times the decode step (the time between tokens) eager and through the bucketed
graph path, side by side per placement and batch (each batch's bucket is captured before timing): on a
GPU the CUDA-graph speed-up, on the CPU the bucketed, padded path's overhead per step (nothing is
captured there; replay calls the same function on the persistent buffers).

An MoE model adds the ``experts-*`` placements (layers resident; every routed expert direct, every one
streamed, or every other layer's direct) and three columns: the experts per tier, the routed experts' bytes
per decode step that were copied in or read in place (only the experts a step routes to), and what
streaming whole layers would move per step for the same offloaded layers (all their experts). Its roofline
counts the expected distinct experts a step touches at each tier's bandwidth.

``--random-model`` benchmarks a model of that exact shape with random weights written on this host
(gh200rt/bench/random_model.py), so a real model size needs no download.
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
from gh200rt.launch_count import counting_launches  # noqa: E402
from gh200rt.loader.load import read_arch  # noqa: E402
from gh200rt.planner.cost_model import direct_layer_seconds, expert_seconds  # noqa: E402
from gh200rt.sampling_params import SamplingParams  # noqa: E402
from gh200rt.bench.random_model import add_random_model_arguments, model_of  # noqa: E402


def placements(num_layers: int) -> dict[str, dict]:
    """Layer placements, and for an MoE model the routed experts' (``experts-*``: layers resident)."""
    every = lambda g: ",".join(f"{i}:streamed" for i in range(g - 1, num_layers, g))  # noqa: E731
    half = ",".join(f"{i}:experts=direct" for i in range(1, num_layers, 2))
    return {"resident": dict(offload="none"),
            "stream": dict(offload="stream", staging_slots=2, prefetch_distance=1),
            "every-2nd": dict(offload="none", layer_tiers=every(2), staging_slots=2, prefetch_distance=1),
            "every-4th": dict(offload="none", layer_tiers=every(4), staging_slots=2, prefetch_distance=1),
            "direct": dict(offload="direct"),
            "direct-host-scales": dict(offload="direct", direct_scales="host"),   # quantized: scales beside codes
            "experts-direct": dict(offload="none", moe_expert_tier="direct"),
            "experts-stream": dict(offload="none", moe_expert_tier="stream"),
            "experts-half-direct": dict(offload="none", moe_expert_tier="resident", layer_tiers=half)}


MOE_PLACEMENTS = ("experts-direct", "experts-stream", "experts-half-direct")
DEFAULT_PLACEMENTS = "resident,stream,every-2nd,every-4th,direct"


@dataclass(frozen=True)
class DecodeRate:
    tokens_per_second: float
    copy_gbps: float
    copy_wait_ms_per_step: float
    captures: int            # decode graphs captured inside the timed steps (0 once warm_up ran)
    expert_link_bytes_per_step: float = 0.0    # routed experts copied in or read in place, per decode step


def prompt_of(i: int, context: int) -> list[int]:
    """Request ``i``'s prompt: four tokens, or ``context`` (its first token its own, so no two share a cached
    prefix)."""
    return [1 + i, 17, 42, 99] + [100 + (7 * j + i) % 900 for j in range(max(0, context - 4))]


def prefill(engine: LLMEngine) -> None:
    """Step until every request has its first token: a long prompt takes several steps (chunked prefill), during
    which the requests prefilled first already decode."""
    engine.step()
    while engine.scheduler.waiting or any(not seq.output_token_ids and not seq.is_finished
                                          for seq in engine.scheduler.running):
        engine.step()


def decode_rate(engine: LLMEngine, batch: int, tokens: int, host_profile=None, context: int = 4) -> DecodeRate:
    """Decode rate over the decode steps of ``batch`` requests of ``tokens`` new tokens each after prompts of
    ``context`` tokens; ``host_profile``: a ``cProfile.Profile`` to run over those steps (the rate then includes
    its overhead)."""
    params = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
    for i in range(batch):
        engine.add_request(f"b{batch}-{i}", None, params, prompt_token_ids=prompt_of(i, context))
    prefill(engine)  # prefill of every request (+ their first token)
    # with async scheduling that call launched the first decode step too: finish it untimed and leave its tokens out
    ahead = engine.rows_in_flight
    if ahead and str(engine.runner.device).startswith("cuda"):
        import torch
        torch.cuda.synchronize()
    before = engine.stats()
    generated, steps = engine.generation_tokens + ahead, 0
    start = time.perf_counter()
    if host_profile is not None:
        host_profile.enable()
    while engine.has_unfinished_requests():
        engine.step()
        steps += 1
    if host_profile is not None:
        host_profile.disable()
    seconds = time.perf_counter() - start
    after = engine.stats()
    expert_bytes = (after.expert_bytes_copied - before.expert_bytes_copied
                    + after.expert_bytes_read_direct - before.expert_bytes_read_direct)
    return DecodeRate((engine.generation_tokens - generated) / seconds,
                      (after.weight_bytes_copied - before.weight_bytes_copied) / seconds / 1e9,
                      (after.copy_wait_seconds - before.copy_wait_seconds) / max(steps, 1) * 1e3,
                      after.graph_captures - before.graph_captures, expert_bytes / max(steps, 1))


@dataclass(frozen=True)
class StepKernels:
    """What one decode step ran on the device: ``count`` kernels and copies (elsewhere the launches issued).
    On a GPU also their summed device time, the span from the first one's start to the last one's end (the
    difference is the device idle between them: launch gaps, host waits), and the costliest kernel names as
    (name, calls, microseconds), most first."""
    count: int | None
    busy_us: float | None = None
    span_us: float | None = None
    costliest: tuple[tuple[str, int, float], ...] = ()


def step_kernels(engine: LLMEngine, batch: int, context: int = 4) -> StepKernels:
    """Kernels one decode step of ``batch`` requests runs: on a GPU the device kernels and copies the profiler
    records (CUDA-graph replays included), with their times; elsewhere the launches the same code issues
    (gh200rt/launch_count.py: torch ops that do work, Triton launches)."""
    # six tokens: with async scheduling the counted step() must still launch a decode step (one that samples the
    # fourth token), not only report the last one
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    for i in range(batch):
        engine.add_request(f"k{batch}-{i}", None, params, prompt_token_ids=prompt_of(i, context))
    prefill(engine)
    engine.step()  # a first decode step: a graph's capture stays out of the counted one
    if str(engine.runner.device).startswith("cuda"):
        result = _profiled_step(engine)
    else:
        with counting_launches() as launches:
            engine.step()
        result = StepKernels(launches.total)
    while engine.has_unfinished_requests():
        engine.step()
    return result


def _profiled_step(engine: LLMEngine) -> StepKernels:
    import torch
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    try:
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            engine.step()
            torch.cuda.synchronize()
    except RuntimeError as err:      # no CUPTI here: the decode figures stand without the count
        print(f"kernels per step not counted: the profiler failed ({err})", flush=True)
        return StepKernels(None)
    device = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    if not device:
        return StepKernels(0)
    by_name: dict[str, list] = {}
    for e in device:
        entry = by_name.setdefault(e.name, [0, 0.0])
        entry[0] += 1
        entry[1] += e.time_range.elapsed_us()
    span = max(e.time_range.end for e in device) - min(e.time_range.start for e in device)
    costliest = sorted(((name, calls, us) for name, (calls, us) in by_name.items()), key=lambda r: -r[2])
    return StepKernels(len(device), sum(us for _, _, us in costliest), span, tuple(costliest))


def print_host_profile(engine: LLMEngine, batch: int, tokens: int, top: int, context: int = 4) -> None:
    """``--host-profile``: the decode steps of another ``batch`` x ``tokens`` run under cProfile, then the ``top``
    functions by their own time per step (where the host's share of a step goes)."""
    import cProfile
    import pstats
    profile = cProfile.Profile()
    rate = decode_rate(engine, batch, tokens, profile, context)
    stats = pstats.Stats(profile)
    steps = max(1, tokens - 1)         # the prefill step samples each request's first token
    print(f"    host profile over {steps} steps ({batch / rate.tokens_per_second * 1e3:.3f} ms a step profiled), "
          f"own time per step:")
    rows = sorted(stats.stats.items(), key=lambda item: -item[1][2])[:top]
    for (path, line, name), (_, calls, own, cumulative, _) in rows:
        print(f"    {own / steps * 1e3:8.3f} ms own {cumulative / steps * 1e3:8.3f} ms with callees {calls / steps:7.1f}x"
              f"  {os.path.basename(path)}:{line}({name})")


def print_step_kernels(kernels: StepKernels, step_ms: float, top: int) -> None:
    """The ``--kernel-times`` lines under a row: busy and idle device time in a step, then the costliest kernels."""
    if kernels.busy_us is None:
        return
    print(f"    {kernels.count} kernels: {kernels.busy_us / 1e3:.3f} ms busy over a {kernels.span_us / 1e3:.3f} ms span "
          f"(step {step_ms:.3f} ms timed; {1 - kernels.busy_us / max(kernels.span_us, 1e-9):.0%} of the span idle)")
    for name, calls, us in kernels.costliest[:top]:
        print(f"    {us / 1e3:8.3f} ms {us / kernels.busy_us:5.1%} {calls:>5}x  {name[:90]}")


def whole_layer_expert_bytes(engine: LLMEngine) -> int:
    """What one decode step would copy if every MoE layer with an offloaded expert streamed all its experts:
    the bytes a routed-experts-only placement is compared with."""
    sizes = engine.plan.sizes
    offloaded = sum(1 for tiers in engine.store.expert_tiers.values() if any(t != "resident" for t in tiers))
    return offloaded * sizes.num_experts * sizes.host_expert_bytes


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


def roofline_tokens_per_second(engine: LLMEngine, batch: int, kv_tokens: float = 0.0) -> float:
    """Decode tokens/s allowed by the platform profile's bandwidths for the plan's weight bytes per step; an MoE
    model's routed experts count as the expected distinct experts a step of ``batch`` tokens touches, each at
    its tier's cost (cost_model.expert_seconds). ``kv_tokens``: the cached positions each sequence's attention
    reads per step on average (``--context``), whose K/V bytes count at the device's bandwidth too."""
    plan, platform = engine.plan, engine.platform
    sizes = plan.sizes
    streamed = plan.tiers.count("streamed") * sizes.host_layer_bytes
    dense_resident = sizes.fixed_memory + plan.tiers.count("resident") * sizes.resident_layer_memory
    kv = batch * kv_tokens * sizes.kv_bytes_per_token
    compute = ((dense_resident + streamed + kv) / (platform.hbm_gbps * 1e9)
               + plan.tiers.count("direct") * direct_layer_seconds(sizes, platform, plan.direct_scales_on_device))
    step = max(compute, streamed / (platform.link_h2d_gbps * 1e9)) + \
        expert_seconds(plan.expert_tiers, sizes, platform, batch)
    return batch / step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--tokens", type=int, default=32, help="decode tokens per request")
    parser.add_argument("--context", type=int, default=4,
                        help="prompt tokens per request (default 4); above 4 the roofline adds the K/V bytes each "
                             "step's attention reads (the average position over the timed steps)")
    parser.add_argument("--placements", default=DEFAULT_PLACEMENTS,
                        help=f"comma-separated, of {', '.join(placements(2))} (the default adds the experts-* "
                             f"ones for an MoE model)")
    parser.add_argument("--host-weight-dtype", default="auto")
    parser.add_argument("--prefetch-across-steps", default="on", choices=["on", "off", "both"],
                        help="'both' runs every placement with a streamed layer twice, without and with the "
                             "next step's first copies issued in the tail of this one")
    add_random_model_arguments(parser)
    parser.add_argument("--json", help="also write every row, with its roofline, to this JSON file")
    parser.add_argument("--layer-path", default="one-call", choices=["one-call", "op-by-op", "both"],
                        help="a decode step's decoder layers in one call where the platform has one (on CUDA six "
                             "launches, models/gpu_decode_layer.py; on the CPU one native call), op by op, or both "
                             "(each placement twice: the baseline in the same run)")
    parser.add_argument("--fused-decode-rows", type=int, default=1,
                        help="with the one-call layer path on CUDA: decode steps of up to this many sequences run "
                             "each layer in six fused launches (--fused-decode-rows of the engine; 1: batch 1 only)")
    parser.add_argument("--pdl", default="off", choices=["off", "on", "both"],
                        help="with the one-call layer path on CUDA (sm_90+): its kernels with programmatic "
                             "dependent launch (--enable-pdl); 'both' runs each one-call placement without, then "
                             "with it")
    parser.add_argument("--async-scheduling", default="off", choices=["off", "on", "both"],
                        help="launch each decode step before the previous step's tokens reach the host; 'both' "
                             "runs each placement without, then with it")
    parser.add_argument("--kernel-times", type=int, default=0, metavar="N",
                        help="on a GPU, print under each row one profiled step's device busy and idle time and its "
                             "N costliest kernels (also in --json)")
    parser.add_argument("--host-profile", type=int, default=0, metavar="N",
                        help="print under each row the N host functions taking the most own time per decode step "
                             "(cProfile over another run of the row's decode steps)")
    parser.add_argument("--graphs", action="store_true",
                        help="time decode steps eager vs the bucketed graph path (see above)")
    args = parser.parse_args()
    if args.context < 4:
        parser.error(f"--context {args.context}: at least 4 (the default prompt's tokens)")
    if args.graphs and args.context != 4:
        parser.error("--context times decode after long prompts; --graphs times the default prompts only")
    with model_of(args) as args.model:
        (run_graphs if args.graphs else run)(args)


def run(args) -> None:
    print(f"load average {os.getloadavg()[0]:.2f}; model {args.model}; host weight dtype {args.host_weight_dtype}")
    arch = read_arch(args.model)
    moe = arch.is_moe
    names = args.placements.split(",") + (list(MOE_PLACEMENTS) if moe and args.placements == DEFAULT_PLACEMENTS
                                          else [])
    width = max(19, max(len(n) for n in names) + (len(" op-by-op") if args.layer_path != "one-call" else 0)
                + (len(f" fused<={args.fused_decode_rows}") if args.fused_decode_rows > 1 else 0)
                + (len(" pdl") if args.pdl != "off" else 0) + (len(" async") if args.async_scheduling != "off" else 0))
    print(f"{'placement':<{width}} {'tiers (res/str/dir)':<20} {'across':>6} {'batch':>5} {'tok/s':>9} "
          f"{'vs resident':>11} {'copy GB/s':>9} {'wait ms/step':>12} {'roofline tok/s':>14} {'kernels/step':>12}"
          + (f" {'experts (r/s/d)':>16} {'expert MB/step':>14} {'whole layers MB':>15}" if moe else ""))
    layers = arch.num_layers
    baseline: dict[int, float] = {}
    rows = []
    across = {"on": [True], "off": [False], "both": [False, True]}[args.prefetch_across_steps]
    layer_paths = {"one-call": [True], "op-by-op": [False], "both": [False, True]}[args.layer_path]
    async_modes = {"off": [False], "on": [True], "both": [False, True]}[args.async_scheduling]
    pdl_modes = {"off": [False], "on": [True], "both": [False, True]}[args.pdl]
    batches = [int(b) for b in args.batches.split(",")]
    # room for every request's prompt and tokens at the largest batch (16-token blocks), and the usual 256 at least
    max_len = max(256, args.context + args.tokens + 16)
    kv_blocks = max(256, max(batches) * -(-max_len // 16) + 16)
    kv_tokens = args.context + args.tokens / 2 if args.context > 4 else 0.0
    for name in names:
        if name in MOE_PLACEMENTS and not moe:
            raise SystemExit(f"--placements {name}: {args.model} has no routed experts")
        runs = [(w, c, a, p) for c in layer_paths for w in across for a in async_modes
                for p in (pdl_modes if c else [False])]
        for wrap, one_call, ahead, pdl in runs:
            config = EngineConfig.from_kwargs(model=args.model, dtype=args.dtype, max_model_len=max_len,
                                              num_kv_blocks=kv_blocks, host_weight_dtype=args.host_weight_dtype,
                                              prefetch_across_steps=wrap, async_scheduling=ahead,
                                              fused_decode_rows=args.fused_decode_rows if one_call else 1,
                                              enable_pdl=pdl, **placements(layers)[name])
            engine = LLMEngine.from_config(config)
            tiers = engine.stats().layers_per_tier
            if not tiers.get("streamed") and wrap is not across[-1]:
                engine.close()           # nothing streams: one row is enough
                continue
            if not one_call:             # before warm_up: the graphs are captured op by op too
                for layer in engine.runner.model.layers:
                    layer.decode_layer_fn = None
            label = f"{tiers.get('resident', 0)}/{tiers.get('streamed', 0)}/{tiers.get('direct', 0)}"
            warm_up(engine, batches)
            for batch in batches:
                rate = decode_rate(engine, batch, args.tokens, context=args.context)
                tps = rate.tokens_per_second
                baseline.setdefault(batch, tps)
                roof = roofline_tokens_per_second(engine, batch, kv_tokens)
                kernels = step_kernels(engine, batch, args.context)
                experts = engine.stats().experts_per_tier
                expert_label = f"{experts.get('resident', 0)}/{experts.get('streamed', 0)}/{experts.get('direct', 0)}"
                whole = whole_layer_expert_bytes(engine) if moe else 0
                fused_label = f" fused<={args.fused_decode_rows}" if one_call and args.fused_decode_rows > 1 else ""
                shown = name + ("" if one_call else " op-by-op") + fused_label + (" pdl" if pdl else "") \
                    + (" async" if ahead else "")
                print(f"{shown:<{width}} {label:<20} {'on' if wrap else 'off':>6} {batch:>5} {tps:>9.1f} "
                      f"{tps / baseline[batch]:>10.2f}x {rate.copy_gbps:>9.2f} {rate.copy_wait_ms_per_step:>12.3f} "
                      f"{roof:>14.1f} {'-' if kernels.count is None else kernels.count:>12}"
                      + (f" {expert_label:>16} {rate.expert_link_bytes_per_step / 1e6:>14.2f} {whole / 1e6:>15.2f}"
                         if moe else "")
                      + (f"  ({rate.captures} graph capture(s) inside the timed steps)" if rate.captures else ""),
                      flush=True)
                print_step_kernels(kernels, batch / tps * 1e3, args.kernel_times)
                if args.host_profile:
                    print_host_profile(engine, batch, args.tokens, args.host_profile, args.context)
                rows.append(dict(placement=name, tiers=label, prefetch_across_steps=wrap, one_call_layers=one_call,
                                 fused_decode_rows=args.fused_decode_rows if one_call else 1, pdl=pdl,
                                 async_scheduling=ahead, batch=batch, context=args.context,
                                 tokens_per_second=tps, vs_resident=tps / baseline[batch], copy_gbps=rate.copy_gbps,
                                 roofline_tokens_per_second=roof, kernels_per_step=kernels.count,
                                 kernel_busy_ms=None if kernels.busy_us is None else kernels.busy_us / 1e3,
                                 kernel_span_ms=None if kernels.span_us is None else kernels.span_us / 1e3,
                                 costliest_kernels=[dict(name=n, calls=c, ms=us / 1e3)
                                                    for n, c, us in kernels.costliest[:args.kernel_times]],
                                 copy_wait_ms_per_step=rate.copy_wait_ms_per_step,
                                 graph_captures_timed=rate.captures,
                                 **(dict(experts=expert_label, expert_link_bytes_per_step=rate.expert_link_bytes_per_step,
                                         whole_layer_expert_bytes=whole) if moe else {})))
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
