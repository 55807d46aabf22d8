"""``latency --prefill``: prompt processing time on the CPU, the first token of N prompts of L tokens, no
prefix-cache hits; each case's best round (every round's figure beside it) and prompt tokens per second."""
from __future__ import annotations

import time

from gh200rt import LLM, SamplingParams
from gh200rt.bench.rounds import alternate, seconds_of


def prompts(count: int, length: int, salt: int) -> list[list[int]]:
    """``count`` prompts of ``length`` ids, none sharing a first block with another prompt or another round."""
    return [[1 + i + 97 * salt, 17] + [100 + (7 * j + i + salt) % 900 for j in range(length - 2)]
            for i in range(count)]


def run_prefill(args) -> None:
    cases = [tuple(int(n) for n in case.split("x")) for case in args.cases.split(",")]
    longest = max(length for _, length in cases)
    llm = LLM(args.model, dtype=args.dtype, enable_prefix_caching=False, max_model_len=longest + 1)
    params = SamplingParams(temperature=0, max_tokens=1)
    llm.generate(prompts(1, min(64, longest), args.rounds), params)  # warm-up: first-call costs out of the timing
    print(f"{'case':<12} {'best s':>8} {'prompt tok/s':>13}  rounds")
    for count, length in cases:
        timed = alternate({"this tree": lambda salt: seconds_of(lambda: llm.generate(prompts(count, length, salt),
                                                                                    params))[0]}, args.rounds)
        rounds = timed["this tree"]
        best = min(rounds)
        print(f"{f'{count} x {length}':<12} {best:8.3f} {count * length / best:13.1f}  "
              f"{' '.join(f'{r:.3f}' for r in rounds)}")
