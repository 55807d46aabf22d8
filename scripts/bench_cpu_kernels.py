"""Decode step time on the CPU with the native ops (``--cpu-kernels native``) against torch's ops, and against
the native ops called op by op (no one-call decoder layer, ``backends/cpu/decode_layer.py``), measured in the
same run.

    python scripts/bench_cpu_kernels.py [--model smollm2-135m] [--dtypes auto,float32] [--batches 1,8,16]
        [--prompt-tokens 128] [--tokens 32] [--rounds 3]

For each dtype (route) and batch, three engines over the same model (torch ops; native ops op by op; native
ops with a decode step's layers in one call each) decode ``--batches`` requests of ``--prompt-tokens`` random
prompt tokens each; the median step time of the decode steps (the time between tokens) is taken per round,
the engines alternate round by round so load from other processes falls on all alike, and the best round is
printed with the speed-ups over torch's ops.
"""
from __future__ import annotations

import argparse
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from gh200rt.config import EngineConfig  # noqa: E402
from gh200rt.engine.engine import LLMEngine  # noqa: E402
from scripts.bench_decode import step_ms  # noqa: E402


def decode_step_ms(engine: LLMEngine, batch: int, prompt_tokens: int, tokens: int, seed: int) -> float:
    rng = random.Random(seed)
    prompts = [[rng.randrange(3, engine.vocab_size) for _ in range(prompt_tokens)] for _ in range(batch)]
    return step_ms(engine, batch, tokens, prompts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--dtypes", default="auto,float32")
    ap.add_argument("--batches", default="1,8,16")
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f}; model {args.model}; prompts of {args.prompt_tokens} tokens, "
          f"{args.tokens} decode steps; best of {args.rounds} rounds")
    print(f"{'dtype':<8} {'batch':>5} {'torch ms':>9} {'op-by-op ms':>11} {'native ms':>9} {'speed-ups':>15}")
    for dtype in args.dtypes.split(","):
        engines = {}
        for name, kernels in (("torch", "torch"), ("op-by-op", "native"), ("native", "native")):
            config = EngineConfig.from_kwargs(model=args.model, dtype=dtype, cpu_kernels=kernels,
                                              max_model_len=args.prompt_tokens + args.tokens + 8)
            engines[name] = LLMEngine.from_config(config)
            if name == "op-by-op":
                for layer in engines[name].runner.model.layers:
                    layer.decode_layer_fn = None
            decode_step_ms(engines[name], 1, 8, 4, seed=0)  # warm-up
        for batch in map(int, args.batches.split(",")):
            times = {kernels: [] for kernels in engines}
            for round_ in range(args.rounds):
                for kernels, engine in engines.items():
                    times[kernels].append(decode_step_ms(engine, batch, args.prompt_tokens, args.tokens, round_))
            old, ops, new = min(times["torch"]), min(times["op-by-op"]), min(times["native"])
            print(f"{dtype:<8} {batch:>5} {old:>9.2f} {ops:>11.2f} {new:>9.2f} {old / ops:>6.2f}x {old / new:>6.2f}x",
                  flush=True)
        for engine in engines.values():
            engine.close()


if __name__ == "__main__":
    main()
