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

    python -m gh200rt.bench latency [--model smollm2-135m] [--batches 1,8] [--tokens 32]
        [--placements resident,stream,every-2nd,direct] [--host-weight-dtype auto] [--dtype auto]
        [--prefetch-across-steps on|off|both] [--layer-path one-call|op-by-op|both] [--fused-decode-rows N]
        [--pdl off|on|both] [--async-scheduling off|on|both] [--context N]
        [--random-model llama3-8b [--random-model-dir DIR]] [--json PATH] [--kernel-times N] [--host-profile N]
        [--graphs]
    python -m gh200rt.bench latency --prefill [--cases 4x1024,1x2000] [--rounds 3] [--model M] [--dtype auto]

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

``--prefill`` times prompt processing instead: the first token of N prompts of L tokens (``--cases NxL,...``), no
prefix-cache hits, each case's best of ``--rounds`` (every round's figure beside it) and prompt tokens per
second. To compare two trees, run it from each in turn (``git worktree add /tmp/base REV``, then ``cd /tmp/base &&
PYTHONPATH=/tmp/base python -m gh200rt.bench latency --prefill``), alternating.
"""
from __future__ import annotations

import argparse
import json
import os

from gh200rt.bench.commands import UsageError
from gh200rt.bench.decode_graphs import run_graphs
from gh200rt.bench.decode_rate import (DEFAULT_PLACEMENTS, MOE_PLACEMENTS, decode_rate, placements,
                                       roofline_tokens_per_second, warm_up, whole_layer_expert_bytes)
from gh200rt.bench.prefill import run_prefill
from gh200rt.bench.random_model import add_random_model_arguments, model_of
from gh200rt.bench.step_kernels import print_host_profile, print_step_kernels, step_kernels
from gh200rt.config import EngineConfig
from gh200rt.engine.engine import LLMEngine
from gh200rt.loader.load import read_arch


def add_arguments(parser: argparse.ArgumentParser) -> None:
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
                             "launches, backends/cuda/decode_layer.py; on the CPU one native call), op by op, or both "
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
    parser.add_argument("--prefill", action="store_true", help="time prompt processing instead (see above)")
    parser.add_argument("--cases", default="4x1024,1x2000", help="--prefill: COUNTxLENGTH, comma-separated")
    parser.add_argument("--rounds", type=int, default=3, help="--prefill: rounds per case (the best is printed)")


def run(args) -> int:
    if args.context < 4:
        raise UsageError(f"--context {args.context}: at least 4 (the default prompt's tokens)")
    if args.graphs and args.context != 4:
        raise UsageError("--context times decode after long prompts; --graphs times the default prompts only")
    if args.prefill and args.graphs:
        raise UsageError("--prefill times prompt processing, --graphs decode steps: choose one")
    with model_of(args) as args.model:
        (run_prefill if args.prefill else run_graphs if args.graphs else run_placements)(args)
    return 0


def run_placements(args) -> None:
    """The decode rate of every placement (and variant) at every batch, next to the first placement's."""
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
          + (f" {'experts (r/s/d/c)':>17} {'expert MB/step':>14} {'whole layers MB':>15}" if moe else ""))
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
                expert_label = f"{experts.get('resident', 0)}/{experts.get('streamed', 0)}/{experts.get('direct', 0)}" \
                    f"/{experts.get('cpu', 0)}"
                whole = whole_layer_expert_bytes(engine) if moe else 0
                fused_label = f" fused<={args.fused_decode_rows}" if one_call and args.fused_decode_rows > 1 else ""
                shown = name + ("" if one_call else " op-by-op") + fused_label + (" pdl" if pdl else "") \
                    + (" async" if ahead else "")
                print(f"{shown:<{width}} {label:<20} {'on' if wrap else 'off':>6} {batch:>5} {tps:>9.1f} "
                      f"{tps / baseline[batch]:>10.2f}x {rate.copy_gbps:>9.2f} {rate.copy_wait_ms_per_step:>12.3f} "
                      f"{roof:>14.1f} {'-' if kernels.count is None else kernels.count:>12}"
                      + (f" {expert_label:>17} {rate.expert_link_bytes_per_step / 1e6:>14.2f} {whole / 1e6:>15.2f}"
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
