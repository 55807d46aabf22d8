"""Decode step time on the CPU with the native ops (``--cpu-kernels native``) against torch's ops, against
the native ops called op by op (no one-call decoder layer, ``backends/cpu/decode_layer.py``) and against one call
per layer (no one-call stack, ``backends/cpu/decode_stack.py``), measured in the same run.

    python -m gh200rt.bench kernel cpu-kernels [--model smollm2-135m] [--dtypes auto,float32] [--batches 1,8,16]
        [--prompt-tokens 128] [--tokens 32] [--rounds 3]

For each dtype (route) and batch, four engines over the same model (torch ops; native ops op by op; native
ops with a decode step's layers in one call each; native ops with the whole stack in one call) decode ``--batches`` requests of ``--prompt-tokens`` random
prompt tokens each; the median step time of the decode steps (the time between tokens) is taken per round,
the engines alternate round by round so load from other processes falls on all alike, and the best round is
printed with the speed-ups over torch's ops.
"""
from __future__ import annotations

import argparse
import os
import random

from gh200rt.bench.decode_rate import step_ms
from gh200rt.bench.rounds import alternate
from gh200rt.config import EngineConfig
from gh200rt.engine.engine import LLMEngine


def decode_step_ms(engine: LLMEngine, batch: int, prompt_tokens: int, tokens: int, seed: int) -> float:
    rng = random.Random(seed)
    prompts = [[rng.randrange(3, engine.vocab_size) for _ in range(prompt_tokens)] for _ in range(batch)]
    return step_ms(engine, batch, tokens, prompts)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--dtypes", default="auto,float32")
    parser.add_argument("--batches", default="1,8,16")
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)


def run(args) -> int:
    print(f"load average {os.getloadavg()[0]:.2f}; model {args.model}; prompts of {args.prompt_tokens} tokens, "
          f"{args.tokens} decode steps; best of {args.rounds} rounds")
    print(f"{'dtype':<8} {'batch':>5} {'torch ms':>9} {'op-by-op ms':>11} {'per-layer ms':>12} {'native ms':>9} "
          f"{'speed-ups over torch':>24}")
    for dtype in args.dtypes.split(","):
        engines = {}
        for name, kernels in (("torch", "torch"), ("op-by-op", "native"), ("per-layer", "native"),
                              ("native", "native")):
            config = EngineConfig.from_kwargs(model=args.model, dtype=dtype, cpu_kernels=kernels,
                                              max_model_len=args.prompt_tokens + args.tokens + 8)
            engines[name] = LLMEngine.from_config(config)
            model = engines[name].runner.model
            if name in ("op-by-op", "per-layer"):
                model.decode_stack_fn = None
            if name == "op-by-op":
                for layer in model.layers:
                    layer.decode_layer_fn = None
            decode_step_ms(engines[name], 1, 8, 4, seed=0)  # warm-up
        for batch in map(int, args.batches.split(",")):
            times = alternate({kernels: (lambda r, engine=engine: decode_step_ms(engine, batch, args.prompt_tokens,
                                                                                  args.tokens, r))
                               for kernels, engine in engines.items()}, args.rounds)
            old, ops, layer, new = (min(times[n]) for n in ("torch", "op-by-op", "per-layer", "native"))
            print(f"{dtype:<8} {batch:>5} {old:>9.2f} {ops:>11.2f} {layer:>12.2f} {new:>9.2f} {old / ops:>6.2f}x "
                  f"{old / layer:>6.2f}x {old / new:>6.2f}x", flush=True)
        for engine in engines.values():
            engine.close()
    return 0
