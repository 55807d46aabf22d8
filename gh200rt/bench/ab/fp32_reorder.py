"""The fp32 CPU route's linears, side by side in one process on SmolLM2-135M: resident weights with the native
float32 kernel for up to NATIVE_F32_MAX_ROWS rows and reordered for oneDNN above (the route now), the
reordered weights alone under the one-row rule (the route before the native kernel), and dense weights with
and without the native rows (what streamed and direct layers compute with, now and before). Round by round,
interleaved (the machine is shared), it times decode steps at each batch and one prefill chunk per length.

    python -m gh200rt.bench ab fp32-reorder [--rounds 4] [--batches 1,8] [--prefill 256,1024]

Prints best and median ms per step, tokens/s at the best step, and the linears' weight GB/s at the best
decode step (every decode step reads each linear weight once) against the dense weights' best.
"""
from __future__ import annotations

import argparse
import itertools
import os
import random
import statistics
import time

import torch

from gh200rt.backends.cpu import linear as native_linear
from gh200rt.bench.models import smollm2_gguf
from gh200rt.bench.rounds import alternate
from gh200rt.config import EngineConfig
from gh200rt.engine import bootstrap
from gh200rt.engine.engine import LLMEngine
from gh200rt.sampling_params import SamplingParams

NATIVE_ROWS = native_linear.NATIVE_F32_MAX_ROWS


def build(reordered: bool, max_len: int) -> LLMEngine:
    chosen = bootstrap.resident_linear_format
    if not reordered:
        bootstrap.resident_linear_format = lambda *args, **kwargs: None
    try:
        config = EngineConfig.from_kwargs(model=smollm2_gguf(), dtype="float32", max_model_len=max_len,
                                          num_kv_blocks=4 * max_len // 16, enable_prefix_caching=False,
                                          max_num_batched_tokens=max_len)
        return LLMEngine.from_config(config)
    finally:
        bootstrap.resident_linear_format = chosen


def one_round(eng: LLMEngine, batches: list[int], prefill: list[int], decode_tokens: int, rng: random.Random,
              ids: itertools.count) -> dict[str, list[float]]:
    """Seconds of each decode step (the first and last of a batch left out) per batch, and of one prefill chunk per
    length, on fresh random prompts."""
    times: dict[str, list[float]] = {}
    for b in batches:
        for _ in range(b):
            eng.add_request(str(next(ids)), None, SamplingParams(temperature=0, max_tokens=decode_tokens,
                                                                 ignore_eos=True),
                            prompt_token_ids=[rng.randrange(3, 49000) for _ in range(8)])
        eng.step()  # the prompts' prefill
        steps = []
        while eng.has_unfinished_requests():
            start = time.perf_counter()
            eng.step()
            steps.append(time.perf_counter() - start)
        times[f"decode b{b}"] = steps[1:-1]
    for p in prefill:
        eng.add_request(str(next(ids)), None, SamplingParams(temperature=0, max_tokens=1, ignore_eos=True),
                        prompt_token_ids=[rng.randrange(3, 49000) for _ in range(p)])
        start = time.perf_counter()
        eng.step()
        times[f"prefill {p}"] = [time.perf_counter() - start]
        while eng.has_unfinished_requests():
            eng.step()
    return times


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--prefill", default="256,1024")
    parser.add_argument("--decode-tokens", type=int, default=12)


def run(args) -> int:
    batches = [int(b) for b in args.batches.split(",")]
    prefill = [int(p) for p in args.prefill.split(",")]
    engines = {"reordered": build(True, max(prefill) + 64), "dense": build(False, max(prefill) + 64)}
    model = engines["dense"].runner.model
    linear_bytes = sum(r.nbytes for i in range(len(model.layers)) for r in model.layer_weight_refs(i).values()) \
        + model.lm_head.weight_ref.nbytes
    modes = {"native rows + reordered": ("reordered", NATIVE_ROWS), "reordered, one-row rule": ("reordered", 0),
             "dense + native rows": ("dense", NATIVE_ROWS), "dense, one-row rule": ("dense", 0)}
    rng, ids = random.Random(0), itertools.count(1)
    print(f"torch threads {torch.get_num_threads()}, load average {os.getloadavg()[0]:.1f} at start; "
          f"{linear_bytes / 1e6:.0f} MB of linear weights")

    def mode_round(name: str, native_rows: int):
        def measure(_round: int) -> dict[str, list[float]]:
            native_linear.NATIVE_F32_MAX_ROWS = native_rows
            return one_round(engines[name], batches, prefill, args.decode_tokens, rng, ids)
        return measure

    runs = alternate({mode: mode_round(*how) for mode, how in modes.items()}, args.rounds,
                     after_round=lambda r: print(f"round {r + 1} of {args.rounds} done, load average "
                                                 f"{os.getloadavg()[0]:.1f}", flush=True))
    native_linear.NATIVE_F32_MAX_ROWS = NATIVE_ROWS
    print(f"{'weights':<24} {'phase':<13} {'best ms':>8} {'median ms':>9} {'tok/s':>8} {'weight GB/s':>11}")
    for mode, rounds in runs.items():
        for phase in rounds[0]:
            ts = [t for times in rounds for t in times[phase]]
            rows = int(phase.split()[-1].lstrip("b"))
            gbps = f"{linear_bytes / min(ts) / 1e9:11.1f}" if phase.startswith("decode") else f"{'':>11}"
            print(f"{mode:<24} {phase:<13} {1e3 * min(ts):8.1f} {1e3 * statistics.median(ts):9.1f} "
                  f"{rows / min(ts):8.1f} {gbps}")
    return 0
