"""Prefill and decode-step time of the CPU engine with one path switched off and on in alternate rounds of one process.

Cross-process timings on a shared machine drift by up to 1.4x; switching a path inside one process and
alternating rounds compares like with like. Each round adds a batch of fresh random prompts of ``--prompt``
tokens (prefix caching off) and steps the engine: the prefill is the wall time until every sequence has its first
token, a decode step the mean of the ``--tokens`` steps after it; the best of ``--rounds`` is printed for each
setting, with how many sequences' greedy tokens agreed between the two in the last round.

Paths (``--path``):

* ``fp16-linear``: the native fp16 linear for 1-8 rows (``kernels/cpu/f16_linear.c``; off: fbgemm's fp16 GEMM
  and op-by-op decode layers). Meaningful on the fp16 route (``--dtype auto`` on an AVX2 CPU).
* ``fp8-kv``: the native kernels' fp8 KV pool paths (writes, attention, the one-call decode layer; off: the
  torch path: quantize, gather, dequantize, SDPA). Runs with ``--kv-cache-dtype fp8``.
* ``row-blocks``: prefix-cache invariance, a step that computes prompt positions running its linears and logits
  head in fixed row blocks (``engine/invariance.py``; off: every call with the rows it has, as before). Decode
  steps do not change; the prefill column is its cost.
* ``batch-invariant``: every step in row blocks (``--batch-invariant``; off: the default, prompt steps only).

    python -m gh200rt.bench ab native-switch --path fp16-linear [--batches 1,2,4,8] [--prompt 4] [--tokens 32]
    python -m gh200rt.bench ab native-switch --path fp8-kv --dtype float32 --batches 1,8 --prompt 500
    python -m gh200rt.bench ab native-switch --path row-blocks --batches 1,8 --prompt 40,300 --tokens 8
"""
from __future__ import annotations

import argparse
import time

import torch

from gh200rt.backends.cpu import decode_layer, half_linear, native, native_checks, ops
from gh200rt.backends.interface import forget_decode_state
from gh200rt.bench.rounds import alternate
from gh200rt.config import EngineConfig
from gh200rt.engine.engine import LLMEngine
from gh200rt.sampling_params import SamplingParams

NATIVE_F16_ROWS = half_linear.NATIVE_F16_MAX_ROWS
FP8_TYPES = dict(native_checks.FP8_KV_TYPES)


def switch(path: str, on: bool, engine: LLMEngine) -> None:
    runner, model = engine.runner, engine.runner.model
    if path == "fp16-linear":
        half_linear.NATIVE_F16_MAX_ROWS = decode_layer.NATIVE_F16_MAX_ROWS = NATIVE_F16_ROWS if on else 0
    elif path == "fp8-kv":
        ops.FP8_KV_TYPES = decode_layer.FP8_KV_TYPES = FP8_TYPES if on else {}
    elif path == "row-blocks":
        runner.row_blocks = on
    else:
        runner.batch_invariant = on
    for layer in model.layers:   # the one-call decode layer's cached arguments follow the switch
        forget_decode_state(layer)


def one_round(engine: LLMEngine, batch: int, prompt: int, tokens: int, seed: int) -> tuple[float, float, list]:
    """Prefill seconds (until every sequence has its first token), mean seconds per decode step after it, and
    each sequence's tokens."""
    gen = torch.Generator().manual_seed(seed)
    params = SamplingParams(temperature=0, max_tokens=tokens + 1, ignore_eos=True)
    ids = [f"r{seed}-{i}" for i in range(batch)]
    for request_id in ids:
        engine.add_request(request_id, None, params,
                           prompt_token_ids=torch.randint(100, 40000, (prompt,), generator=gen).tolist())
    produced = {i: [] for i in ids}
    start, prefill, steps = time.perf_counter(), None, 0
    while engine.has_unfinished_requests():
        for out in engine.step():
            produced[out.request_id] = list(out.outputs[0].token_ids)
        if prefill is None:
            if all(produced[i] for i in ids):
                prefill, decode_start = time.perf_counter() - start, time.perf_counter()
        else:
            steps += 1
    step = (time.perf_counter() - decode_start) / max(steps, 1)
    return prefill, step, [produced[i] for i in ids]


def with_path(args, engine: LLMEngine, on: bool, batch: int, prompt: int):
    """A round (its index seeds the prompts) of ``one_round`` with the path switched ``on`` or off."""
    def measure(r: int):
        switch(args.path, on, engine)
        return one_round(engine, batch, prompt, args.tokens, seed=1000 * r + batch)
    return measure


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--path", choices=["fp16-linear", "fp8-kv", "row-blocks", "batch-invariant"], required=True)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--cpu-route", default="auto")
    parser.add_argument("--batches", default="1,2,4,8")
    parser.add_argument("--prompt", default="4", help="prompt tokens per sequence (a list: a table per length)")
    parser.add_argument("--tokens", type=int, default=32, help="decode tokens timed per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)


def run(args) -> int:
    torch.set_num_threads(args.threads)
    if native.load_native_ops() is None:
        raise SystemExit(f"native CPU ops unavailable: {native.native_ops_error()}")
    options = dict(kv_cache_dtype="fp8") if args.path == "fp8-kv" else {}
    prompts = [int(p) for p in args.prompt.split(",")]
    engine = LLMEngine.from_config(EngineConfig.from_kwargs(
        model=args.model, dtype=args.dtype, cpu_route=args.cpu_route, enable_prefix_caching=False,
        max_model_len=max(256, max(prompts) + args.tokens + 8), **options))
    print(f"{args.path}: {args.model} --dtype {args.dtype} --cpu-route {args.cpu_route}, {args.threads} threads, "
          f"prompts of {args.prompt} tokens, {args.tokens} decode tokens, best of {args.rounds} rounds (off / on "
          f"alternated)")
    print(f"{'batch':>5} {'prompt':>6} {'prefill off':>12} {'prefill on':>11} {'on/off':>7} {'step off':>10} "
          f"{'step on':>9} {'speed-up':>9} {'same tokens':>12}")
    try:
        for prompt in prompts:
            for batch in (int(b) for b in args.batches.split(",")):
                runs = alternate({on: with_path(args, engine, on, batch, prompt) for on in (False, True)},
                                 args.rounds)
                best = {on: (min(p for p, _, _ in done), min(s for _, s, _ in done)) for on, done in runs.items()}
                tokens = {on: done[-1][2] for on, done in runs.items()}
                same = sum(a == b for a, b in zip(tokens[False], tokens[True]))
                print(f"{batch:>5} {prompt:>6} {best[False][0]:>10.3f} s {best[True][0]:>9.3f} s "
                      f"{best[True][0] / best[False][0]:>6.2f}x {best[False][1] * 1e3:>7.1f} ms "
                      f"{best[True][1] * 1e3:>6.1f} ms {best[False][1] / best[True][1]:>8.2f}x {same:>7}/{batch}")
    finally:
        switch(args.path, args.path != "batch-invariant", engine)
        engine.close()
    return 0
