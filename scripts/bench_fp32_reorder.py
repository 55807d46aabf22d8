"""The fp32 CPU route's linears, side by side in one process on SmolLM2-135M: resident weights with the native
float32 kernel for up to NATIVE_F32_MAX_ROWS rows and reordered for oneDNN above (the route now), the
reordered weights alone under the one-row rule (the route before the native kernel), and dense weights with
and without the native rows (what streamed and direct layers compute with, now and before). Round by round,
interleaved (the machine is shared), it times decode steps at each batch and one prefill chunk per length.

    python scripts/bench_fp32_reorder.py [--rounds 4] [--batches 1,8] [--prefill 256,1024]

Prints best and median ms per step, tokens/s at the best step, and the linears' weight GB/s at the best
decode step (every decode step reads each linear weight once) against the dense weights' best.
"""
from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from gh200rt.backends.cpu import linear as native_linear  # noqa: E402
from gh200rt.config import EngineConfig  # noqa: E402
from gh200rt.engine import bootstrap  # noqa: E402
from gh200rt.engine.engine import LLMEngine  # noqa: E402
from gh200rt.sampling_params import SamplingParams  # noqa: E402
from scripts.bench_offline import smollm2_gguf  # noqa: E402

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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--prefill", default="256,1024")
    ap.add_argument("--decode-tokens", type=int, default=12)
    args = ap.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    prefill = [int(p) for p in args.prefill.split(",")]
    engines = {"reordered": build(True, max(prefill) + 64), "dense": build(False, max(prefill) + 64)}
    model = engines["dense"].runner.model
    linear_bytes = sum(r.nbytes for i in range(len(model.layers)) for r in model.layer_weight_refs(i).values()) \
        + model.lm_head.weight_ref.nbytes
    modes = {"native rows + reordered": ("reordered", NATIVE_ROWS), "reordered, one-row rule": ("reordered", 0),
             "dense + native rows": ("dense", NATIVE_ROWS), "dense, one-row rule": ("dense", 0)}
    phases = [f"decode b{b}" for b in batches] + [f"prefill {p}" for p in prefill]
    times: dict[tuple[str, str], list[float]] = {(m, p): [] for m in modes for p in phases}
    rng, uid = random.Random(0), 0
    print(f"torch threads {torch.get_num_threads()}, load average {os.getloadavg()[0]:.1f} at start; "
          f"{linear_bytes / 1e6:.0f} MB of linear weights")
    for r in range(args.rounds):
        for mode, (name, native_rows) in modes.items():
            native_linear.NATIVE_F32_MAX_ROWS = native_rows
            eng = engines[name]
            for b in batches:
                for _ in range(b):
                    uid += 1
                    eng.add_request(str(uid), None, SamplingParams(temperature=0, max_tokens=args.decode_tokens,
                                                                   ignore_eos=True),
                                    prompt_token_ids=[rng.randrange(3, 49000) for _ in range(8)])
                eng.step()  # the prompts' prefill
                steps = []
                while eng.has_unfinished_requests():
                    start = time.perf_counter()
                    eng.step()
                    steps.append(time.perf_counter() - start)
                times[(mode, f"decode b{b}")] += steps[1:-1]
            for p in prefill:
                uid += 1
                eng.add_request(str(uid), None, SamplingParams(temperature=0, max_tokens=1, ignore_eos=True),
                                prompt_token_ids=[rng.randrange(3, 49000) for _ in range(p)])
                start = time.perf_counter()
                eng.step()
                times[(mode, f"prefill {p}")].append(time.perf_counter() - start)
                while eng.has_unfinished_requests():
                    eng.step()
        print(f"round {r + 1} of {args.rounds} done, load average {os.getloadavg()[0]:.1f}", flush=True)
    native_linear.NATIVE_F32_MAX_ROWS = NATIVE_ROWS
    print(f"{'weights':<24} {'phase':<13} {'best ms':>8} {'median ms':>9} {'tok/s':>8} {'weight GB/s':>11}")
    for (mode, phase), ts in times.items():
        rows = int(phase.split()[-1].lstrip("b"))
        gbps = f"{linear_bytes / min(ts) / 1e9:11.1f}" if phase.startswith("decode") else f"{'':>11}"
        print(f"{mode:<24} {phase:<13} {1e3 * min(ts):8.1f} {1e3 * statistics.median(ts):9.1f} "
              f"{rows / min(ts):8.1f} {gbps}")


if __name__ == "__main__":
    main()
