"""A server under stress (issue 27): a soak of mixed load, then proof that it let go of everything; or
(``--overload``) N requests at once, and what became of each.

    python -m gh200rt.bench stress                             # 10 minutes on the default server (SmolLM2, CPU)
    python -m gh200rt.bench stress --duration 60 --concurrency 8 --json soak.json
    python -m gh200rt.bench stress --url http://127.0.0.1:8000     # a server already running
    python -m gh200rt.bench stress --duration 10 --server-args "--model DIR --max-model-len 512"

Without --url it starts ``python -m gh200rt.serve`` from this checkout on a free port (--server-args
are passed on; none: the default server) and stops it at the end. --concurrency clients each loop
over the kinds of gh200rt/bench/soak_load.py (plain and streamed, chat and completions, aborts,
disconnects, structured outputs, seeded repeats, n=2) until --duration has passed. Every
--sample-interval seconds it reads /metrics: the server's RSS, KV blocks in use, running / waiting
sequences, admitted sequences, pending requests and asyncio tasks.

At the end the load stops, the server gets --settle seconds to drain, and the run passes when: no
request failed or was refused; every seeded repeat gave the same text; every finished structured
answer matched its schema; no KV block is in use, nothing runs, waits, is admitted or pending; the
event loop has no more tasks than when idle before the load; the median RSS of the last third of
the samples after --warmup is within --rss-tolerance of the first third's; /health answers 200.
It prints each figure next to its bound and exits 1 when any bound is missed.

``--overload``:

    python -m gh200rt.bench stress --overload                  # 500 at the default server (SmolLM2, CPU)
    python -m gh200rt.bench stress --overload --server-args "--max-queued-requests 64" --prompt-words 120 \
        --max-tokens 64
    python -m gh200rt.bench stress --overload --url http://127.0.0.1:8000

--requests requests leave together: a quarter each streamed chat, plain chat, streamed completion,
plain completion, every one ``ignore_eos`` with --max-tokens, so a complete answer has exactly that
many tokens. Each must end as a complete answer (200: one finish_reason, usage, ``[DONE]`` for a
stream) or a clean refusal (503 with ``Retry-After``, a JSON error body, sent before any stream
starts); any other status, broken body or transport error is a failure. Afterwards the server must
drain to nothing held (admitted sequences, pending requests, KV blocks, running, waiting), keep no
more asyncio tasks than before, and answer /health 200. Prints the counts, latencies (p50 / p99 /
max) of each outcome, the Retry-After values, preemptions and the server's RSS before, at the end of
the burst and 2 s after it drained; exits 1 on any failure. tests/server/test_overload_toy.py runs the
same burst in CI against a small toy server.
"""
from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

from gh200rt.bench.overload import run_overload
from gh200rt.bench.server import add_server_arguments
from gh200rt.bench.soak import run_soak


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_server_arguments(parser)
    parser.add_argument("--overload", action="store_true", help="--requests requests at once instead of a soak")
    soak = parser.add_argument_group("the soak (the default)")
    soak.add_argument("--duration", type=float, default=600.0, help="seconds of load")
    soak.add_argument("--concurrency", type=int, default=8, help="clients sending at once")
    soak.add_argument("--seed", type=int, default=0, help="seed of the clients' choices")
    soak.add_argument("--sample-interval", type=float, default=5.0, help="seconds between /metrics samples")
    soak.add_argument("--warmup", type=float, help="seconds of load before RSS counts (default: a fifth of "
                                                   "--duration, at most 60)")
    soak.add_argument("--rss-tolerance", type=float, default=0.05, help="RSS drift allowed, as a fraction")
    soak.add_argument("--settle", type=float, default=60.0, help="seconds the server gets to drain at the end")
    soak.add_argument("--json", type=Path, help="also write the figures and every sample here")
    burst = parser.add_argument_group("--overload")
    burst.add_argument("--requests", type=int, default=500)
    burst.add_argument("--max-tokens", type=int, default=32, help="tokens of every answer (ignore_eos)")
    burst.add_argument("--prompt-words", type=int, default=2, help="words after each prompt's number")


def run(args) -> int:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))   # a SIGTERM still stops the server (served's finally)
    return run_overload(args) if args.overload else run_soak(args)
