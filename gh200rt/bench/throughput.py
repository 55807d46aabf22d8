"""Throughput on many requests at once, on the CPU: offline ``LLM.generate`` against transformers (the default), or
the served workload on the engine alone (``--engine-served``).

    python -m gh200rt.bench throughput [--requests 64] [--max-tokens 32] [--hf-sequential 8] [--rounds 2]
                                       [--threads N] [--routes fp32 fp32-flinear fp16]
    python -m gh200rt.bench throughput --engine-served [--requests 48] [--concurrency 8] [--dtype auto]
                                                       [--threads 1]

Prints tokens/s for (1) gh200rt LLM.generate over all requests, per route (fp32: the default, all
resident, linears through oneDNN over weights reordered at start-up; fp32-flinear: dense weights with oneDNN
off, i.e. F.linear;
fp16: --offload direct --host-weight-dtype fp16; auto: the CPU's default route, bf16 through oneDNN
with AVX-512 BF16 / AMX; int8-bf16: int8 weights, bf16 activations), (2) transformers generating the requests one at
a time (the first --hf-sequential of them; a rate, so a subset is a fair sample), (3) transformers
generating all requests as one left-padded static batch; then the ratios against the floor (5x
one-at-a-time) and the goal (1.5x static batching). Both sides decode greedily for exactly
--max-tokens tokens from the same fp32 weights (the SmolLM2 GGUF, dequantized). The gh200rt routes
and the static batch are interleaved over --rounds rounds (the machine is shared); best round wins.

Second figure: scheduler + input preparation time per step with 256 running decode requests
(no model), against the 2 ms goal.

``--engine-served``: the served workload of ``peers`` (N requests, 128 random tokens in / 64 out, C in flight)
driven on ``LLMEngine`` directly, without HTTP: what the engine alone achieves, to hold against the served figure
(the difference is the server's cost), and where the engine's time goes. Reports output tok/s (wall), the
engine's CPU seconds (less sensitive than wall time to other processes on a shared machine), decode-only steps
(count, p50 wall ms, weight bytes read per second against the route's weight bytes) and steps that prefill (count,
tokens, wall ms), and minor page faults per prefill step.
"""
from __future__ import annotations

import argparse

from gh200rt.bench.engine_served import run_engine_served
from gh200rt.bench.offline import ROUTES, run_offline


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--engine-served", action="store_true",
                        help="the served workload on LLMEngine, without HTTP, instead of offline LLM.generate")
    parser.add_argument("--requests", type=int, default=None, help="requests (default 64; --engine-served: 48)")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch CPU threads (default: torch's choice; --engine-served: 1)")
    offline = parser.add_argument_group("offline (the default)")
    offline.add_argument("--max-tokens", type=int, default=32)
    offline.add_argument("--hf-sequential", type=int, default=8, help="requests transformers runs one at a time")
    offline.add_argument("--skip-model", action="store_true", help="only the scheduler figure")
    offline.add_argument("--rounds", type=int, default=2)
    offline.add_argument("--routes", nargs="+", default=["fp32"], choices=list(ROUTES))
    served = parser.add_argument_group("--engine-served")
    served.add_argument("--concurrency", type=int, default=8)
    served.add_argument("--input-len", type=int, default=128)
    served.add_argument("--output-len", type=int, default=64)
    served.add_argument("--dtype", default="auto")


def run(args) -> int:
    if args.engine_served:
        args.requests = 48 if args.requests is None else args.requests
        args.threads = 1 if args.threads is None else args.threads
        run_engine_served(args)
    else:
        args.requests = 64 if args.requests is None else args.requests
        run_offline(args)
    return 0
