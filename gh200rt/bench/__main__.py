"""``python -m gh200rt.bench <subcommand> ...``: every benchmark of gh200rt, each figure next to its baseline or
limit measured in the same run (docs/BENCHMARKS.md records them with their commands).

``python -m gh200rt.bench <subcommand> --help`` describes one; ``kernel`` and ``ab`` list their own names."""
from __future__ import annotations

import sys

from gh200rt.bench.commands import Command, default_prog, dispatch

COMMANDS = {
    "latency": Command("gh200rt.bench.latency", "decode tokens/s per weight placement and batch (--prefill: prompt "
                                                "processing time)"),
    "throughput": Command("gh200rt.bench.throughput", "offline LLM.generate against transformers (--engine-served: "
                                                      "the served workload on the engine alone)"),
    "serve": Command("gh200rt.bench.serve", "load generator over HTTP (OpenAI /v1/completions): TTFT, TPOT, ITL"),
    "tiers": Command("gh200rt.bench.tiers", "static resident, streamed and dynamic tiers on one bursty trace"),
    "multi-turn": Command("gh200rt.bench.multi_turn", "conversations that come back, with the host KV tier off and "
                                                      "on: TTFT of later turns"),
    "speculative": Command("gh200rt.bench.speculative", "decoding with and without speculative decoding on an "
                                                        "input-grounded workload: tok/s and acceptance"),
    "peers": Command("gh200rt.bench.peers", "gh200rt against vLLM, llama.cpp and transformers (--routes: every "
                                            "gh200rt route against transformers)"),
    "stress": Command("gh200rt.bench.stress", "a soak of mixed load, then proof the server let go of everything "
                                              "(--overload: N requests at once)"),
    "bandwidth": Command("gh200rt.bench.bandwidth", "host memory read bandwidth per NUMA placement and reader"),
    "tp": Command("gh200rt.bench.tp", "tensor parallelism on the CPU: step time and its share in collectives"),
    "accuracy": Command("gh200rt.bench.accuracy", "perplexity and logit error per CPU route (--routes) or host "
                                                  "weight format (--formats)"),
    "kernel": Command("gh200rt.bench.kernel", "one kernel or op timed against its bound or baseline"),
    "ab": Command("gh200rt.bench.ab", "a path switched off and on in alternate rounds of one process"),
}


def main(argv: list[str] | None = None) -> int:
    return dispatch(sys.argv[1:] if argv is None else argv, COMMANDS, default_prog(), __doc__)


if __name__ == "__main__":
    sys.exit(main())
