"""``multi-turn``: conversations that come back, with the host KV tier off and on in the same run.

N conversations of T turns over one shared system prompt: each turn's prompt is the last prompt, its answer and a
new user message, so everything but the new message was computed before. Every turn submits the N conversations'
next prompts, ``--concurrency`` of them in flight (the next one is submitted as one finishes). The device KV pool
holds ``--pool-fraction`` of the conversations' final length (at least one conversation), so by its next turn most
of a conversation's blocks were reused on the device: without the tier its history is recomputed, with it the
history is loaded from host memory (``on``), or read there in place by attention (``in-place``, ``auto``:
``--kv-offloading-reads``). ``--restart-each-turn`` runs every turn on a new engine (a server restarted between
turns): the device pool and host memory start empty, and only ``disk`` (the tier with ``--kv-offloading-disk-dir``
in a directory the run makes and deletes) brings the history back, read from disk.

Reports per engine: TTFT p50 / p99 of turn 1 and of later turns (from a request's submission to its first token),
output tok/s, the tokens the device pool and the host tier supplied, bytes stored and loaded,
preemptions; and turn >= 2 TTFT p50 without the tier over with it. The same prompts and outputs go to both engines
(greedy), so they compute the same tokens.
"""
from __future__ import annotations

import argparse
import os
import random
import tempfile
import time
from collections import Counter

import torch

from gh200rt.bench.models import smollm2_gguf
from gh200rt.bench.random_model import add_random_model_arguments, model_of
from gh200rt.config import EngineConfig
from gh200rt.engine.engine import LLMEngine
from gh200rt.sampling_params import SamplingParams


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=None, help="model path or alias (default: SmolLM2-135M GGUF)")
    parser.add_argument("--dtype", default="auto")
    add_random_model_arguments(parser)
    parser.add_argument("--conversations", type=int, default=8)
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--system-tokens", type=int, default=512, help="the shared system prompt")
    parser.add_argument("--user-tokens", type=int, default=128, help="each turn's new message")
    parser.add_argument("--output-tokens", type=int, default=32)
    parser.add_argument("--concurrency", type=int, default=2, help="requests in flight")
    parser.add_argument("--pool-fraction", type=float, default=0.25,
                        help="the device KV pool holds this share of the conversations' final KV")
    parser.add_argument("--kv-offloading-size", default="1", help="the host tier, as the engine flag takes it")
    parser.add_argument("--write-policy", default="write_through", choices=("write_through", "write_back"))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--order", default="off,on", help="the engines in the order they run: off (no tier), on "
                                                          "(the tier, hits loaded), in-place (hits read in place), "
                                                          "auto (--kv-offloading-reads auto), disk (on, over a disk "
                                                          "tier); e.g. on,in-place,off")
    parser.add_argument("--restart-each-turn", action="store_true",
                        help="a new engine for every turn (what a restart keeps: the disk tier's blocks only)")


def conversation_plan(args) -> tuple[list[list[int]], list[list[list[int]]]]:
    """The first prompts, and each turn's new user messages per conversation (answers come from the engine)."""
    rng = random.Random(0)
    system = [rng.randrange(100, 49000) for _ in range(args.system_tokens)]
    firsts = [system + [rng.randrange(100, 49000) for _ in range(args.user_tokens)]
              for _ in range(args.conversations)]
    messages = [[[rng.randrange(100, 49000) for _ in range(args.user_tokens)] for _ in range(args.conversations)]
                for _ in range(args.turns - 1)]
    return firsts, messages


def run_turn(engine: LLMEngine, prompts: list[list[int]], params: SamplingParams, tag: str, concurrency: int):
    """Run ``prompts``, ``concurrency`` at a time; (TTFT seconds per request, answers)."""
    submitted: dict[int, float] = {}
    ttft: dict[int, float] = {}
    answers: dict[int, list[int]] = {}
    while len(answers) < len(prompts):
        while len(submitted) - len(answers) < concurrency and len(submitted) < len(prompts):
            i = len(submitted)
            engine.add_request(f"{tag}-{i}", None, params, prompt_token_ids=prompts[i])
            submitted[i] = time.perf_counter()
        for out in engine.step():
            i = int(out.request_id.rsplit("-", 1)[1])
            if i not in ttft and out.outputs[0].token_ids:
                ttft[i] = time.perf_counter() - submitted[i]
            if out.finished:
                answers[i] = list(out.outputs[0].token_ids)
    return [ttft[i] for i in range(len(prompts))], [answers[i] for i in range(len(prompts))]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# name -> --kv-offloading-reads
ENGINES = {"off": None, "on": "load", "in-place": "in_place", "auto": "auto", "disk": "load"}


def tally(stats, into: Counter) -> None:
    """Add an engine's counters to ``into`` (a run over several engines, one per turn, reports their sums)."""
    host = stats.kv_host
    into.update(device_hit_tokens=stats.prefix_cache_hit_tokens, preemptions=stats.num_preemptions)
    if host is not None:
        into.update(host_hit_tokens=host.hit_tokens, stored=host.stored_bytes, loaded=host.loaded_bytes,
                    in_place=host.read_in_place_blocks,
                    disk_hit_blocks=host.disk.hit_blocks if host.disk is not None else 0)


def run_engine(args, name: str, firsts, messages) -> dict:
    with tempfile.TemporaryDirectory(prefix="gh200rt-kv-disk-") as disk_dir:
        return run_engines(args, name, firsts, messages, disk_dir)


def run_engines(args, name: str, firsts, messages, disk_dir: str) -> dict:
    bs = 16
    final = args.system_tokens + args.turns * (args.user_tokens + args.output_tokens)
    per_conversation = -(-final // bs)
    blocks = max(per_conversation + 1, int(args.pool_fraction * args.conversations * per_conversation))
    options = dict(model=args.model or smollm2_gguf(), dtype=args.dtype, max_model_len=final + bs,
                   num_kv_blocks=blocks, max_num_seqs=args.conversations)
    reads = ENGINES[name]
    if reads is not None:
        options.update(kv_offloading_size=args.kv_offloading_size, kv_offloading_write_policy=args.write_policy,
                       kv_offloading_reads=reads)
    if name == "disk":
        options.update(kv_offloading_disk_dir=disk_dir, prefix_caching_hash_algo="sha256")
    config = EngineConfig.from_kwargs(**options)
    params = SamplingParams(temperature=0, max_tokens=args.output_tokens, ignore_eos=True)
    counts, ttfts, tokens, wall = Counter(), [], 0, 0.0
    engine = None
    try:
        for turn in range(args.turns):
            if engine is None or args.restart_each_turn:
                if engine is not None:
                    tally(engine.stats(), counts)
                    engine.close()
                engine = LLMEngine.from_config(config)
                in_vocab = lambda ids: [3 + i % (engine.vocab_size - 3) for i in ids]  # noqa: E731 (past special ids)
                if turn == 0:
                    prompts = [in_vocab(p) for p in firsts]
                    messages = [[in_vocab(m) for m in turn_messages] for turn_messages in messages]
                run_turn(engine, [prompts[0][:64]], SamplingParams(temperature=0, max_tokens=2), "warm", 1)
            started = time.perf_counter()
            times, answers = run_turn(engine, prompts, params, f"t{turn}", args.concurrency)
            wall += time.perf_counter() - started
            ttfts.append(times)
            tokens += sum(len(a) for a in answers)
            if turn + 1 < args.turns:
                prompts = [p + a + m for p, a, m in zip(prompts, answers, messages[turn])]
        tally(engine.stats(), counts)
    finally:
        if engine is not None:
            engine.close()
    later = [t for times in ttfts[1:] for t in times]
    return dict(label=f"tier {name}", blocks=blocks, per_conversation=per_conversation,
                ttft1=(percentile(ttfts[0], 0.5), percentile(ttfts[0], 0.99)),
                ttft_later=(percentile(later, 0.5), percentile(later, 0.99)) if later else (float("nan"),) * 2,
                tok_s=tokens / wall, **{key: counts[key] for key in (
                    "device_hit_tokens", "host_hit_tokens", "stored", "loaded", "in_place", "disk_hit_blocks",
                    "preemptions")})


def run(args) -> int:
    torch.set_num_threads(args.threads)
    firsts, messages = conversation_plan(args)
    results = {}
    with model_of(args) as args.model:
        for name in args.order.split(","):
            if name not in ENGINES:
                raise SystemExit(f"--order: {', '.join(ENGINES)}, comma-separated; got {args.order!r}")
            results[name] = run_engine(args, name, firsts, messages)
    first = next(iter(results.values()))
    print(f"{args.conversations} conversations x {args.turns} turns, {args.concurrency} in flight: system "
          f"{args.system_tokens} + {args.user_tokens} per message, {args.output_tokens} out; device pool "
          f"{first['blocks']} blocks ({args.pool_fraction:g} of {args.conversations} x {first['per_conversation']}); "
          f"dtype {args.dtype}, {args.threads} thread(s), "
          f"{'a new engine every turn, ' if args.restart_each_turn else ''}load average {os.getloadavg()[0]:.1f}")
    print(f"{'engine':<13} {'TTFT t1 p50':>11} {'p99':>7} {'TTFT t2+ p50':>12} {'p99':>7} {'tok/s':>7} "
          f"{'device hit tok':>14} {'host hit tok':>12} {'MB stored':>9} {'MB loaded':>9} {'in place':>8} "
          f"{'from disk':>9} {'preempted':>9}")
    for r in results.values():
        print(f"{r['label']:<13} {r['ttft1'][0]:11.3f} {r['ttft1'][1]:7.3f} {r['ttft_later'][0]:12.3f} "
              f"{r['ttft_later'][1]:7.3f} {r['tok_s']:7.1f} {r['device_hit_tokens']:14d} {r['host_hit_tokens']:12d} "
              f"{r['stored'] / 1e6:9.1f} {r['loaded'] / 1e6:9.1f} {r['in_place']:8d} {r['disk_hit_blocks']:9d} "
              f"{r['preemptions']:9d}")
    if "off" in results:
        for name in (n for n in results if n != "off"):
            off, tier = results["off"], results[name]
            print(f"turn >= 2 TTFT p50: {off['ttft_later'][0] / tier['ttft_later'][0]:.2f}x lower with the host tier "
                  f"({name}); output tok/s {tier['tok_s'] / off['tok_s']:.2f}x")
    return 0
