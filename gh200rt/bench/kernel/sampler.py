"""The sampler's time per step (``Sampler.launch(...).result()``) at decode batches, one row per sequence, for
the sampling settings requests commonly use, on the CPU or, with ``--device cuda``, the GPU.

    python -m gh200rt.bench kernel sampler [--batches 1,8,64] [--vocab 49152] [--reps 20] [--device cpu]

The logits are normal with a standard deviation of 3: flatter than a trained model's, so top-p keeps many ids (the
CPU's top-p window rarely covers them: its worst case). Each setting is timed after three untimed calls, with
freed memory kept for reuse as the engine keeps it (``backends/cpu/host_allocator.py``). The baseline is greedy, the
cheapest, measured in the same run.
"""
from __future__ import annotations

import argparse
import time

import torch

from gh200rt.backends.cpu.host_allocator import keep_freed_memory
from gh200rt.bench.commands import UsageError
from gh200rt.engine.sampler import Sampler
from gh200rt.sampling_params import SamplingParams
from gh200rt.scheduler.request import Sequence

SETTINGS = {
    "greedy": dict(temperature=0),
    "temperature 0.7": dict(temperature=0.7),
    "temperature 0.7, top-k 40": dict(temperature=0.7, top_k=40),
    "temperature 0.7, top-p 0.9": dict(temperature=0.7, top_p=0.9),
    "temperature 0.7, min-p 0.05": dict(temperature=0.7, min_p=0.05),
    "greedy, 1 row with logprobs": "one-logprobs",
    "greedy, every row logprobs 5": dict(temperature=0, logprobs=5),
}


def rows_for(setting, batch: int) -> list[Sequence]:
    if setting == "one-logprobs":
        params = [dict(temperature=0, logprobs=1)] + [dict(temperature=0)] * (batch - 1)
    else:
        params = [setting] * batch
    return [Sequence(f"s{i}", f"s{i}", 0, [1, 2, 3], SamplingParams(**p), i) for i, p in enumerate(params)]


def time_setting(sampler: Sampler, logits: torch.Tensor, seqs: list[Sequence], reps: int) -> float:
    for _ in range(3):
        sampler.launch(logits.clone(), seqs).result()
    if logits.is_cuda:
        torch.cuda.synchronize()
    total = 0.0
    for _ in range(reps):
        step_logits = logits.clone()
        start = time.perf_counter()
        sampler.launch(step_logits, seqs).result()
        total += time.perf_counter() - start
    return total / reps * 1e3


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--batches", default="1,8,64")
    parser.add_argument("--vocab", type=int, default=49152, help="SmolLM2's 49,152 by default; Llama 3's is 128,256")
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--device", default="cpu")


def run(args) -> int:
    batches = [int(b) for b in args.batches.split(",")]
    if min(batches) < 1 or args.vocab < 2 or args.reps < 1:
        raise UsageError("--batches values and --reps must be at least 1, --vocab at least 2")
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda: no CUDA GPU here")
    keep_freed_memory()
    print(f"sampler ms per step on {args.device} ({torch.get_num_threads()} threads), vocabulary {args.vocab}")
    print(f"{'setting':<30}" + "".join(f"{f'batch {b}':>12}{'vs greedy':>10}" for b in batches))
    greedy = {}
    for name, setting in SETTINGS.items():
        cells = ""
        for batch in batches:
            logits = (torch.randn(batch, args.vocab, generator=torch.Generator().manual_seed(batch)) * 3).to(device)
            ms = time_setting(Sampler(seed=0), logits, rows_for(setting, batch), args.reps)
            greedy.setdefault(batch, ms)
            cells += f"{ms:>12.3f}{ms / greedy[batch]:>9.1f}x"
        print(f"{name:<30}{cells}", flush=True)
    return 0
