"""Prompt processing time on the CPU: the first token of N prompts of L tokens, no prefix-cache hits.

    python scripts/bench_prefill.py [--cases 4x1024,1x2000] [--rounds 3] [--dtype auto]

Prints each case's best round (every round's figure beside it) and prompt tokens per second. To compare two
trees, run this script from each in turn (another tree: ``git worktree add /tmp/base REV``, then
``cd /tmp/base && PYTHONPATH=/tmp/base python scripts/bench_prefill.py``), alternating.
"""
from __future__ import annotations

import argparse
import time

from gh200rt import LLM, SamplingParams


def prompts(count: int, length: int, salt: int) -> list[list[int]]:
    """``count`` prompts of ``length`` ids, none sharing a first block with another prompt or another round."""
    return [[1 + i + 97 * salt, 17] + [100 + (7 * j + i + salt) % 900 for j in range(length - 2)]
            for i in range(count)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--cases", default="4x1024,1x2000", help="COUNTxLENGTH, comma-separated")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    cases = [tuple(int(n) for n in case.split("x")) for case in args.cases.split(",")]
    longest = max(length for _, length in cases)
    llm = LLM(args.model, dtype=args.dtype, enable_prefix_caching=False, max_model_len=longest + 1)
    params = SamplingParams(temperature=0, max_tokens=1)
    llm.generate(prompts(1, min(64, longest), args.rounds), params)  # warm-up: first-call costs out of the timing
    print(f"{'case':<12} {'best s':>8} {'prompt tok/s':>13}  rounds")
    for count, length in cases:
        rounds = []
        for salt in range(args.rounds):
            start = time.perf_counter()
            llm.generate(prompts(count, length, salt), params)
            rounds.append(time.perf_counter() - start)
        best = min(rounds)
        print(f"{f'{count} x {length}':<12} {best:8.3f} {count * length / best:13.1f}  "
              f"{' '.join(f'{r:.3f}' for r in rounds)}")


if __name__ == "__main__":
    main()
