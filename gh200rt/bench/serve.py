"""Serving load generator over HTTP (OpenAI /v1/completions, streamed), as serving benchmarks report it.

Modes: a Poisson arrival rate (--request-rate R) or a fixed number of requests in flight
(--max-concurrency C). Prompts: random token ids, or a shared prefix plus a random suffix
(--dataset shared-prefix). Reports request throughput, output tokens/s, TTFT, TPOT, ITL and
E2E latency (mean, p50, p99). --structured json constrains every request to a JSON schema (an array
of objects with at least --output-len items, so no answer can end early and both runs generate the
same tokens); --compare-structured runs the same prompts unconstrained and then constrained, in one
process, and prints the cost of the grammar. --sampling chooses how every request samples: greedy (the default),
or "sampled", llama.cpp's server defaults (temperature 0.8, top-k 40, top-p 0.95, min-p 0.05) with a repetition
penalty of 1.1. Exits 1 when any request failed. Examples:

  python -m gh200rt.bench serve --base-url http://127.0.0.1:8000 --num-prompts 32 --max-concurrency 4
  python -m gh200rt.bench serve --num-prompts 32 --max-concurrency 8 --compare-structured
"""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import time
from dataclasses import dataclass, field

import httpx

from gh200rt.bench.commands import UsageError
from gh200rt.bench.rounds import alternate

SAMPLING = {"greedy": {"temperature": 0},
            "sampled": {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05, "repetition_penalty": 1.1}}


@dataclass
class Result:
    ok: bool
    prompt_len: int
    output_tokens: int = 0
    ttft: float = 0.0
    e2e: float = 0.0
    itls: list[float] = field(default_factory=list)
    error: str = ""


def make_prompts(args, vocab_hint: int) -> list[list[int]]:
    rng = random.Random(args.seed)
    low, high = 100, max(101, vocab_hint - 100)      # stay clear of special tokens at both ends
    shared = [rng.randrange(low, high) for _ in range(args.shared_prefix_len)]
    prompts = []
    for _ in range(args.num_prompts):
        suffix = [rng.randrange(low, high) for _ in range(args.input_len)]
        prompts.append((shared if args.dataset == "shared-prefix" else []) + suffix)
    return prompts


def bench_schema(min_items: int) -> dict:
    """Nested objects, enums, bounded strings: a typical extraction schema that cannot close before
    ``min_items`` items, so constrained answers are as long as unconstrained ones."""
    item = {"type": "object", "additionalProperties": False, "required": ["id", "name", "tags"], "properties": {
        "id": {"type": "integer", "minimum": 0, "maximum": 9999}, "name": {"type": "string", "maxLength": 12},
        "tags": {"type": "array", "maxItems": 3, "items": {"enum": ["red", "green", "blue"]}}}}
    return {"type": "array", "minItems": min_items, "items": item}


async def one_request(client: httpx.AsyncClient, args, prompt: list[int]) -> Result:
    body = {"model": args.model, "prompt": prompt, "max_tokens": args.output_len, **SAMPLING[args.sampling],
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    if args.structured == "json":
        body["structured_outputs"] = {"json": bench_schema(args.output_len)}
    start = time.perf_counter()
    result = Result(ok=False, prompt_len=len(prompt))
    last = None
    try:
        async with client.stream("POST", "/v1/completions", json=body) as r:
            if r.status_code != 200:
                result.error = f"HTTP {r.status_code}: {(await r.aread())[:200]!r}"
                return result
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("usage"):
                    result.output_tokens = chunk["usage"]["completion_tokens"]
                if not chunk["choices"] or not chunk["choices"][0]["text"]:
                    continue
                now = time.perf_counter()
                if last is None:
                    result.ttft = now - start
                else:
                    result.itls.append(now - last)
                last = now
        result.e2e = time.perf_counter() - start
        result.ok = True
    except httpx.HTTPError as e:
        result.error = repr(e)
    return result


async def load(args) -> tuple[list[Result], float]:
    """Every prompt sent as the mode says: (each request's result, the seconds from the first send to the last
    answer)."""
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    limits = httpx.Limits(max_connections=max(args.max_concurrency or 0, 64))
    async with httpx.AsyncClient(base_url=args.base_url, headers=headers, timeout=args.timeout,
                                 limits=limits) as client:
        if args.model is None:
            args.model = (await client.get("/v1/models")).json()["data"][0]["id"]
        prompts = make_prompts(args, args.vocab_size)
        gate = asyncio.Semaphore(args.max_concurrency or len(prompts))
        rng = random.Random(args.seed + 1)

        async def limited(p):
            async with gate:
                return await one_request(client, args, p)

        start = time.perf_counter()
        tasks = []
        for p in prompts:
            tasks.append(asyncio.create_task(limited(p)))
            if args.request_rate != float("inf"):
                await asyncio.sleep(rng.expovariate(args.request_rate))
        results = await asyncio.gather(*tasks)
        return results, time.perf_counter() - start


def _stats(values: list[float]) -> str:
    if not values:
        return "n/a"
    ordered = sorted(values)
    p = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
    return f"mean {1000 * statistics.mean(values):8.1f}  p50 {1000 * p(0.5):8.1f}  p99 {1000 * p(0.99):8.1f} ms"


def report(args, results: list[Result], duration: float) -> int:
    """Print the summary; returns the number of failed requests."""
    ok = [r for r in results if r.ok]
    out_tokens = sum(r.output_tokens for r in ok)
    tpots = [(r.e2e - r.ttft) / (r.output_tokens - 1) for r in ok if r.output_tokens > 1]
    mode = f"max-concurrency {args.max_concurrency}" if args.max_concurrency else f"rate {args.request_rate}/s"
    print(f"mode: {mode}; dataset {args.dataset}; sampling {args.sampling}; output constraint: {args.structured}; "
          f"{args.num_prompts} prompts x {args.input_len}"
          f"{f' + {args.shared_prefix_len} shared' if args.dataset == 'shared-prefix' else ''} in, "
          f"{args.output_len} out; model {args.model}")
    print(f"successful requests: {len(ok)} / {len(results)}  (failed: {len(results) - len(ok)})")
    for r in results:
        if not r.ok:
            print(f"  failure: {r.error}")
            break
    print(f"duration:            {duration:8.2f} s")
    print(f"request throughput:  {len(ok) / duration:8.2f} req/s")
    print(f"output tokens/s:     {out_tokens / duration:8.1f}   (baseline, one request alone: "
          f"{args.single_stream_tps:.1f})" if args.single_stream_tps else
          f"output tokens/s:     {out_tokens / duration:8.1f}")
    print(f"TTFT:  {_stats([r.ttft for r in ok])}")
    print(f"TPOT:  {_stats(tpots)}")
    print(f"ITL:   {_stats([x for r in ok for x in r.itls])}")
    print(f"E2E:   {_stats([r.e2e for r in ok])}")
    return len(results) - len(ok)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--base-url", default="http://127.0.0.1:8000")
    parser.add_argument("--model", default=None, help="model name to send; default: the first of /v1/models")
    parser.add_argument("--api-key", default=None)
    parser.add_argument("--num-prompts", type=int, default=32)
    parser.add_argument("--input-len", type=int, default=64, help="random tokens per prompt")
    parser.add_argument("--output-len", type=int, default=32)
    parser.add_argument("--dataset", choices=("random", "shared-prefix"), default="random")
    parser.add_argument("--shared-prefix-len", type=int, default=256)
    parser.add_argument("--vocab-size", type=int, default=49152, help="range of random token ids")
    parser.add_argument("--request-rate", type=float, default=float("inf"), help="Poisson arrivals per second")
    parser.add_argument("--max-concurrency", type=int, default=None, help="requests in flight at most")
    parser.add_argument("--baseline", action="store_true", help="first measure one request alone, as a baseline")
    parser.add_argument("--structured", choices=("none", "json"), default="none",
                    help="constrain every request to a JSON schema (structured_outputs)")
    parser.add_argument("--compare-structured", action="store_true",
                    help="run unconstrained, then JSON-constrained, on the same prompts; report the slowdown")
    parser.add_argument("--rounds", type=int, default=1, help="with --compare-structured: alternated rounds of each")
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sampling", choices=tuple(SAMPLING), default="greedy",
                    help="greedy, or llama.cpp's sampling defaults with a repetition penalty of 1.1")


def run(args) -> int:
    if args.num_prompts < 1 or args.input_len < 1 or args.output_len < 1:
        raise UsageError("--num-prompts, --input-len and --output-len must be at least 1")
    args.single_stream_tps = 0.0
    if args.baseline:
        solo = argparse.Namespace(**{**vars(args), "num_prompts": 1, "max_concurrency": 1, "dataset": "random",
                                     "request_rate": float("inf")})
        results, duration = asyncio.run(load(solo))
        args.model = solo.model
        args.single_stream_tps = sum(r.output_tokens for r in results if r.ok) / duration
    if not args.compare_structured:
        results, duration = asyncio.run(load(args))
        return 1 if report(args, results, duration) else 0
    warm = argparse.Namespace(**{**vars(args), "num_prompts": min(4, args.num_prompts), "structured": "json"})
    asyncio.run(load(warm))                        # first-request costs (allocation, lazy set-up) hit neither side

    def constrained(structured: str):
        def measure(_round: int) -> tuple[float, int]:
            args.structured = structured
            results, duration = asyncio.run(load(args))
            failed = report(args, results, duration)
            print()
            return sum(r.output_tokens for r in results if r.ok) / duration, failed
        return measure
    rounds = alternate({"none": constrained("none"), "json": constrained("json")}, args.rounds)
    failed = sum(f for runs in rounds.values() for _, f in runs)
    none, json_ = (statistics.mean(rate for rate, _ in rounds[s]) for s in ("none", "json"))
    print(f"constrained vs unconstrained output tokens/s over {args.rounds} alternated round(s): {json_:.1f} vs "
          f"{none:.1f} ({100 * (1 - json_ / none):+.1f}% slower with the JSON grammar)")
    return 1 if failed else 0
