"""Static all-resident, static all-streamed, static splits and dynamic tiers on one open-loop bursty trace, in one run.

The trace: a quiet phase (a few short requests), a burst that needs more KV cache than all-resident
leaves under the budget, then quiet again (``--bursts N``: N bursts, each followed by a quiet phase). Arrivals are open-loop (Poisson, fixed seed): a request
arrives at its time whether or not the engine keeps up, exactly as it would at a server. Each engine
runs in this process on the same budget (``--device-memory-budget``, standing in for HBM on the CPU).

Reported per engine: output throughput over the trace, TTFT and TPOT p50 / p99, preemptions,
goodput (requests per second meeting the SLO: TTFT <= --slo-ttft and TPOT <= --slo-tpot), the tier
moves and the share of time spent at each tier split (resident / streamed layers); on a GPU also the decode
graphs' capture time and the device bytes allocated before the engine starts and after it closes (a leak shows
as a difference).

Engines: ``resident``, ``streamed``, ``dynamic``, and ``static-N``: N layers streamed, spread evenly (the split the
planner's ``fewest_streamed`` would pick for N), the rest resident, fixed for the whole trace; a few values of N
give the best static split on this budget to set against dynamic tiers.

    python -m gh200rt.bench tiers [--model smollm2-135m] [--budget-kv-blocks 24] [--seed 0]
        [--quiet-rate 1] [--quiet-seconds 8] [--burst-requests 24] [--burst-seconds 2] [--bursts 1]
        [--slo-ttft 5] [--slo-tpot 0.5] [--no-step-target] [--engines resident,streamed,dynamic] [--json PATH]
        [--random-model llama3-8b [--random-model-dir DIR]]
    python -m gh200rt.bench tiers --engines resident,streamed,static-4,static-8,static-16,dynamic ...

On a GPU decode steps replay CUDA graphs (the engines' default; ``--enforce-eager`` turns them off), so
tier moves there recapture graphs; each engine's row counts its captures.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import random
import statistics
import sys
import time
from dataclasses import dataclass, field

from gh200rt.bench.random_model import add_random_model_arguments, model_of
from gh200rt.config import EngineConfig
from gh200rt.engine.engine import LLMEngine
from gh200rt.planner.layout import spread_evenly
from gh200rt.sampling_params import SamplingParams

OFFLOAD = {"resident": "none", "streamed": "stream", "dynamic": "dynamic"}


@dataclass
class Request:
    request_id: str
    arrival: float
    prompt: list[int]
    max_tokens: int
    first_token: float | None = None
    finished: float | None = None
    tokens: int = 0


@dataclass
class Result:
    engine: str
    requests: list[Request]
    seconds: float
    preemptions: int
    moves: dict[str, int]
    graph_captures: int
    split_seconds: dict[str, float] = field(default_factory=dict)
    capture_seconds: float = 0.0
    device_bytes_before: int | None = None   # allocated on the GPU before the engine started (None on the CPU)
    device_bytes_after: int | None = None    # ... and after it closed
    host_hit_tokens: int | None = None       # prompt tokens the host KV tier supplied (None: no tier)
    kv_pool_bytes: int = 0                   # the KV pool's share of the budget when the trace started


def make_trace(args, vocab: int) -> list[Request]:
    rng = random.Random(args.seed)
    out, clock = [], 0.0

    def add(at: float, prompt_len: int, max_tokens: int):
        out.append(Request(f"r{len(out)}", at, [rng.randrange(3, vocab) for _ in range(prompt_len)], max_tokens))

    for phase in ("quiet",) + ("burst", "quiet") * args.bursts:
        if phase == "quiet":
            end = clock + args.quiet_seconds
            while True:
                clock += rng.expovariate(args.quiet_rate)
                if clock >= end:
                    clock = end
                    break
                add(clock, args.quiet_prompt, args.quiet_tokens)
        else:
            for _ in range(args.burst_requests):
                add(clock + rng.uniform(0, args.burst_seconds), args.burst_prompt, args.burst_tokens)
            clock += args.burst_seconds
    return sorted(out, key=lambda r: r.arrival)


def static_split(name: str, num_layers: int) -> str | None:
    """``--layer-tiers`` of engine ``static-N`` (N layers streamed, spread evenly); None for the named engines."""
    if name in OFFLOAD:
        return None
    count = name.removeprefix("static-")
    if not name.startswith("static-") or not count.isdigit() or not 0 < int(count) <= num_layers:
        raise ValueError(f"--engines: unknown engine {name!r}; choose from {', '.join(OFFLOAD)} or static-N "
                         f"(N streamed layers, 1 <= N <= {num_layers})")
    return ",".join(f"{i}:streamed" for i in spread_evenly(num_layers, int(count)))


def base_config(args, offload: str, layer_tiers: str | None = None) -> EngineConfig:
    return EngineConfig.from_kwargs(model=args.model, dtype=args.dtype, max_model_len=args.max_model_len,
                                    offload=offload, layer_tiers=layer_tiers, device_memory_budget=str(args.budget),
                                    max_num_seqs=args.max_num_seqs, retier_interval_steps=args.retier_interval,
                                    retier_min_dwell_seconds=args.retier_dwell,
                                    retier_max_step_seconds=args.slo_tpot if args.step_target else None,
                                    enforce_eager=True if args.enforce_eager else None,
                                    kv_offloading_size=args.kv_offloading_size)


def budget_bytes(args) -> int:
    """All-resident weights, activations and the ring, plus ``--budget-kv-blocks`` KV blocks."""
    probe = LLMEngine.from_config(EngineConfig.from_kwargs(model=args.model, dtype=args.dtype,
                                                           max_model_len=args.max_model_len, offload="none",
                                                           max_num_seqs=args.max_num_seqs))
    ledger, plan = probe.ledger, probe.plan
    fixed = ledger.used - ledger.by_kind["kv_pool"]
    block = plan.sizes.kv_bytes_per_token * plan.block_size
    ring = 2 * plan.sizes.host_layer_bytes
    probe.close()
    return fixed + ring + args.budget_kv_blocks * block


def device_bytes() -> int | None:
    """Bytes allocated on the GPU once everything released is collected (None without one)."""
    import torch
    if not torch.cuda.is_available():
        return None
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    return torch.cuda.memory_allocated()


def warm_up(engine: LLMEngine, args) -> None:
    """First-call costs stay out of the trace: a quiet-sized and a burst-sized prompt decoded side by side (the
    kernels the trace's prompt lengths and a decode batch compile), within the KV all-resident has, so that no
    engine moves a tier or preempts before the trace. Without it the first engine of a run paid the compilations
    in its TTFT (the first H200 run's all-resident p50 of 1.97 s)."""
    for i, length in enumerate((args.quiet_prompt, args.burst_prompt)):
        engine.add_request(f"warm-up-{i}", None, SamplingParams(temperature=0, max_tokens=4, ignore_eos=True),
                           prompt_token_ids=[5 + (j * 7 + i) % 97 for j in range(length)])
    while engine.has_unfinished_requests():
        engine.step()


def run_engine(name: str, args, trace: list[Request], num_layers: int) -> Result:
    split_tiers = static_split(name, num_layers)
    before = device_bytes()
    engine = LLMEngine.from_config(base_config(args, OFFLOAD.get(name, "none"), split_tiers))
    reqs = [Request(r.request_id, r.arrival, r.prompt, r.max_tokens) for r in trace]
    by_id = {r.request_id: r for r in reqs}
    warm_up(engine, args)
    kv_pool_bytes = engine.ledger.by_kind["kv_pool"]
    pending = list(reqs)
    split: dict[str, float] = {}
    start = time.perf_counter()
    while pending or engine.has_unfinished_requests():
        now = time.perf_counter() - start
        while pending and pending[0].arrival <= now:
            r = pending.pop(0)
            engine.add_request(r.request_id, None, SamplingParams(temperature=0, max_tokens=r.max_tokens,
                                                                   ignore_eos=True), prompt_token_ids=r.prompt)
        if not engine.has_unfinished_requests():
            time.sleep(max(0.0, pending[0].arrival - now))
            continue
        counts = engine.store.tier_counts
        label = f"{counts['resident']}/{counts['streamed']}"
        step_start = time.perf_counter()
        outputs = engine.step()
        stamp = time.perf_counter()
        split[label] = split.get(label, 0.0) + stamp - step_start
        for out in outputs:
            r = by_id[out.request_id]
            r.tokens = len(out.outputs[0].token_ids)
            if r.first_token is None and r.tokens:
                r.first_token = stamp - start
            if out.finished:
                r.finished = stamp - start
    seconds = time.perf_counter() - start
    stats = engine.stats()
    capture_seconds = engine.graphs.capture_seconds if engine.graphs is not None else 0.0
    engine.close()
    del engine
    return Result(name, reqs, seconds, stats.num_preemptions, stats.retier_counts, stats.graph_captures, split,
                  capture_seconds, before, device_bytes(),
                  stats.kv_host.hit_tokens if stats.kv_host is not None else None, kv_pool_bytes)


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def summarize(result: Result, args) -> dict:
    reqs = result.requests
    ttft = [r.first_token - r.arrival for r in reqs]
    tpot = [(r.finished - r.first_token) / (r.tokens - 1) for r in reqs if r.tokens > 1]
    good = [r for r in reqs if r.first_token - r.arrival <= args.slo_ttft
            and (r.tokens < 2 or (r.finished - r.first_token) / (r.tokens - 1) <= args.slo_tpot)]
    total = sum(result.split_seconds.values()) or 1.0
    return dict(engine=result.engine, seconds=result.seconds,
                output_tokens_per_second=sum(r.tokens for r in reqs) / result.seconds,
                ttft_p50=statistics.median(ttft), ttft_p99=pct(ttft, 0.99),
                tpot_p50=statistics.median(tpot), tpot_p99=pct(tpot, 0.99),
                preemptions=result.preemptions, goodput=len(good) / result.seconds, slo_met=len(good),
                # requests over each target (one over both counts in both)
                missed_ttft=sum(t > args.slo_ttft for t in ttft),
                missed_tpot=sum(r.tokens >= 2 and (r.finished - r.first_token) / (r.tokens - 1) > args.slo_tpot
                                for r in reqs),
                requests=len(reqs), moves=result.moves, graph_captures=result.graph_captures,
                graph_capture_seconds=result.capture_seconds, device_bytes_before=result.device_bytes_before,
                device_bytes_after=result.device_bytes_after, host_hit_tokens=result.host_hit_tokens,
                kv_pool_mib=result.kv_pool_bytes / 2**20,
                split_share={k: v / total for k, v in sorted(result.split_seconds.items())},
                # each request's (TTFT, TPOT) in seconds (TPOT None for one token): goodput at another SLO later
                latencies=[(t, None if r.tokens < 2 else (r.finished - r.first_token) / (r.tokens - 1))
                           for t, r in zip(ttft, reqs)])


def leak_note(row: dict) -> str:
    before, after = row["device_bytes_before"], row["device_bytes_after"]
    if before is None:
        return ""
    return f"  device bytes before/after {before / 2**20:.1f}/{after / 2**20:.1f} MiB" + \
        (" (LEAK)" if after > before else "")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--engines", default="resident,streamed,dynamic",
                        help="comma-separated: resident, streamed, dynamic, static-N (N layers streamed, spread "
                             "evenly)")
    parser.add_argument("--max-model-len", type=int, default=256)
    parser.add_argument("--max-num-seqs", type=int, default=32)
    parser.add_argument("--budget-kv-blocks", type=int, default=24,
                        help="KV blocks all-resident has under the budget (the budget is derived from it)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quiet-rate", type=float, default=1.0, help="requests per second in the quiet phases")
    parser.add_argument("--quiet-seconds", type=float, default=8.0)
    parser.add_argument("--quiet-prompt", type=int, default=48)
    parser.add_argument("--quiet-tokens", type=int, default=24)
    parser.add_argument("--burst-requests", type=int, default=24)
    parser.add_argument("--burst-seconds", type=float, default=2.0)
    parser.add_argument("--bursts", type=int, default=1,
                        help="bursts in the trace, each followed by a quiet phase: goodput over several is steadier "
                             "(one burst's admission waves can land either side of the TTFT target)")
    parser.add_argument("--burst-prompt", type=int, default=160)
    parser.add_argument("--burst-tokens", type=int, default=48)
    parser.add_argument("--slo-ttft", type=float, default=5.0, help="seconds")
    parser.add_argument("--slo-tpot", type=float, default=0.5, help="seconds per output token")
    parser.add_argument("--retier-interval", type=int, default=4)
    parser.add_argument("--retier-dwell", type=float, default=0.25)
    parser.add_argument("--step-target", action=argparse.BooleanOptionalAction, default=True,
                        help="give the dynamic engine the TPOT SLO as --retier-max-step-seconds (default: on)")
    parser.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs (default: graphs on a GPU)")
    parser.add_argument("--require-moves", action="store_true",
                        help="exit 1 when the dynamic engine made no tier move (the trace did not exercise it)")
    parser.add_argument("--kv-offloading-size", help="every engine with a host KV tier of this size (GiB, as the "
                        "engine's flag): a preempted request's published blocks come back from host memory")
    parser.add_argument("--rounds", type=int, default=1,
                        help="run the engines this many times over, in order, in one process: compare the last "
                             "round's rows (the first engine of a process pays compilations a short warm-up does not "
                             "cover: on an H200 all-resident's goodput was 0 run first and 11.1 req/s run last)")
    parser.add_argument("--json", help="also write the summary to this JSON file")
    add_random_model_arguments(parser)


def run(args) -> int:
    if args.rounds < 1:
        raise SystemExit(f"--rounds must be at least 1, got {args.rounds}")
    if args.bursts < 1:
        raise SystemExit(f"--bursts must be at least 1, got {args.bursts}")
    with model_of(args) as args.model:
        rows = run_trace(args)
    still = [r["engine"] for r in rows if r["engine"] == "dynamic" and not sum(r["moves"].values())]
    if args.require_moves and still:
        print("--require-moves: the dynamic engine made no tier move on this trace; raise --burst-requests "
              "or lower --budget-kv-blocks", file=sys.stderr)
        return 1
    return 0


def run_trace(args) -> list[dict]:
    """Every engine of ``--engines`` over the same trace, a summary row each (printed, and in ``--json``)."""
    args.budget = budget_bytes(args)
    from gh200rt.loader.load import read_arch
    arch = read_arch(args.model)
    for name in args.engines.split(","):
        static_split(name, arch.num_layers)   # an unknown engine is refused before any runs
    trace = make_trace(args, arch.vocab_size)
    burst_blocks = args.burst_requests * -(-(args.burst_prompt + args.burst_tokens) // 16)
    print(f"load average {os.getloadavg()[0]:.2f}; model {args.model}; budget {args.budget / 2**20:.1f} MiB "
          f"(all-resident beside a staging ring leaves {args.budget_kv_blocks} KV blocks, an engine "
          f"without a ring the ring's bytes too; the burst wants {burst_blocks}); "
          f"{len(trace)} requests over {trace[-1].arrival:.1f} s; SLO TTFT <= {args.slo_ttft} s, "
          f"TPOT <= {args.slo_tpot} s")
    rows = []
    for round_, name in ((r, n) for r in range(1, args.rounds + 1) for n in args.engines.split(",")):
        if args.rounds > 1 and name == args.engines.split(",")[0]:
            print(f"round {round_} of {args.rounds}", flush=True)
        row = summarize(run_engine(name, args, trace, arch.num_layers), args)
        row["round"] = round_
        rows.append(row)
        split = ", ".join(f"{k} {v:.0%}" for k, v in row["split_share"].items())
        print(f"{name:<9} {row['output_tokens_per_second']:7.1f} tok/s  TTFT p50/p99 {row['ttft_p50']:6.2f}/"
              f"{row['ttft_p99']:6.2f} s  TPOT p50/p99 {row['tpot_p50'] * 1e3:6.1f}/{row['tpot_p99'] * 1e3:6.1f} ms  "
              f"preempted {row['preemptions']:3d}  goodput {row['goodput']:5.2f} req/s ({row['slo_met']}/"
              f"{row['requests']}; over TTFT {row['missed_ttft']}, over TPOT {row['missed_tpot']})  "
              f"KV pool {row['kv_pool_mib']:.0f} MiB  moves {row['moves'] or '-'}  "
              f"graph captures {row['graph_captures']} "
              f"({row['graph_capture_seconds']:.2f} s)  time per split (res/str): {split}" + leak_note(row)
              + (f"  host KV hit tokens {row['host_hit_tokens']}" if row["host_hit_tokens"] is not None else ""),
              flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(args={k: v for k, v in vars(args).items()}, rows=rows), f, indent=1)
    return rows
