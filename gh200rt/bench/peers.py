"""gh200rt against vLLM's CPU backend, llama.cpp and transformers on the same prompts, in one run (issue 14).

    python -m gh200rt.bench peers [--engines gh200rt:auto gh200rt:fp32 vllm:float32 vllm:bfloat16 llamacpp
                                   transformers] [--rows single offline served] [--threads 2] [--rounds 2]
                                  [--peer-python .venv-peers/bin/python]
    python -m gh200rt.bench peers --routes [fp32 fp16 ...] [--tokens 48] [--rounds 3] [--threads N]

(``gh200rt:<route>+batch-invariant`` runs that route with ``--batch-invariant``; ``llamacpp:no-repack`` keeps
llama.cpp's weights in the file's layout, for hosts where its AMX buffers crash.)

Rows (the table of issue 14):
  single   single-stream greedy decode of --single-tokens tokens, tok/s (prefill excluded)
  offline  --requests prompts of random token ids (80-150 tokens, ~7.3k in all) x --offline-tokens new
           tokens, submitted at once: output tok/s (each round its own tokens, same lengths: no prefix
           cache hits from an earlier round or the warm-up)
  served   --served-requests requests of 128 random tokens in / 64 out at concurrency 8 against the
           engine's OpenAI server, measured by ``python -m gh200rt.bench serve``: output tok/s, TPOT p50, TTFT p50

Each engine runs in its own process (gh200rt/bench/peer_worker.py), the peers with --peer-python (an
environment of their own: see docs/BENCHMARKS.md for the pip commands). An engine whose package does not
import there is skipped with the reason. vLLM and transformers read the GGUF dequantized to a Hugging
Face directory (written once, by transformers' GGUF reader, under --work-dir); gh200rt and llama.cpp
read the GGUF itself. Everyone decodes greedily with EOS ignored and computes on cores 0..threads-1 (vLLM's
OpenMP threads, gh200rt's engine thread). Engines run one after another, so
on a shared machine compare figures from the same run only (rerun a few times, take the median).

``--routes`` instead decodes one stream in this process on every gh200rt route given (all by default) next to
transformers, rounds interleaved, with llama.cpp's figure quoted (gh200rt/bench/peers_routes.py says how).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time

import httpx

from gh200rt.bench import peers_routes, serve
from gh200rt.bench.models import smollm2_gguf

# run by path under --peer-python, whose environment has no gh200rt: the worker imports only the standard library
WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "peer_worker.py")
DEFAULT_ENGINES = ["gh200rt:auto", "gh200rt:fp32", "vllm:float32", "vllm:bfloat16", "llamacpp", "transformers"]
IMPORTS = {"vllm": "vllm", "llamacpp": "llama_cpp", "transformers": "transformers"}


def worker_command(engine: str, peer_python: str) -> list[str]:
    """The worker of ``engine``: gh200rt's as a module of this interpreter's gh200rt, a peer's by path under the
    peers' interpreter."""
    if engine.startswith("gh200rt"):
        return [sys.executable, "-m", "gh200rt.bench.peer_worker"]
    return [peer_python, WORKER]


def missing_reason(engine: str, peer_python: str) -> str | None:
    kind = engine.partition(":")[0]
    if kind == "gh200rt":
        return None
    if not os.path.exists(peer_python):
        return f"no peer environment at {peer_python}"
    probe = subprocess.run([peer_python, "-c", f"import {IMPORTS[kind]}"], capture_output=True, text=True)
    return None if probe.returncode == 0 else f"import {IMPORTS[kind]} failed: {probe.stderr.strip()[-200:]}"


def random_prompts(count: int, low_len: int, high_len: int, seed: int = 0, vocab: int = 49152) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(100, vocab - 100) for _ in range(rng.randint(low_len, high_len))] for _ in range(count)]


def fresh_tokens(prompts: list[list[int]], seed: int, vocab: int = 49152) -> list[list[int]]:
    """Prompts of the same lengths with other random tokens: each offline round (and the warm-up) gets its
    own, so no engine's prefix cache serves a round from the one before."""
    rng = random.Random(seed)
    return [[rng.randrange(100, vocab - 100) for _ in p] for p in prompts]


def hf_dir(work_dir: str, gguf: str, peer_python: str) -> str:
    out = os.path.join(work_dir, "smollm2-hf")
    if not os.path.exists(os.path.join(out, "config.json")):
        subprocess.run([peer_python, WORKER, "--write-hf", gguf, out], check=True, capture_output=True)
    return out


def engine_cores(threads: int) -> str:
    return "0" if threads == 1 else f"0-{threads - 1}"


def engine_env(threads: int) -> dict[str, str]:
    """Every engine on ``threads`` CPU threads, bound to cores 0..threads-1: vLLM binds its OpenMP threads
    there, gh200rt its engine thread (``--engine-cpus``; an offline worker as a whole). On a shared machine
    an unbound engine loses far more to other processes than a bound one (docs/benchmarks/peers.md, run 4)."""
    return dict(os.environ, OMP_NUM_THREADS=str(threads), VLLM_CPU_KVCACHE_SPACE="2",
                VLLM_CPU_OMP_THREADS_BIND=engine_cores(threads))


def bind_to(threads: int):
    cores = set(range(threads))
    return lambda: os.sched_setaffinity(0, cores)


def run_worker(engine: str, spec: dict, worker: list[str], timeout: float) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        spec_path, out_path = os.path.join(tmp, "spec.json"), os.path.join(tmp, "out.json")
        with open(spec_path, "w", encoding="utf-8") as f:
            json.dump(spec, f)
        env = engine_env(spec["threads"])
        bind = bind_to(spec["threads"]) if engine.startswith("gh200rt") else None
        proc = subprocess.run([*worker, engine, spec_path, out_path], capture_output=True, text=True,
                              timeout=timeout, env=env, preexec_fn=bind)
        if proc.returncode != 0:
            return {"error": (proc.stderr or proc.stdout).strip()[-600:]}
        with open(out_path, encoding="utf-8") as f:
            return json.load(f)


def server_command(engine: str, args, gguf: str, hf: str | None, port: int) -> list[str] | None:
    kind, _, variant = engine.partition(":")
    if kind == "gh200rt":
        variant, _, mode = variant.partition("+")
        route = ["--dtype", "float32"] if variant == "fp32" else \
            ["--offload", "direct", "--host-weight-dtype", "int8"] if variant == "int8" else []
        route += ["--batch-invariant"] if mode == "batch-invariant" else []
        return [sys.executable, "-m", "gh200rt.serve", "--model", gguf, "--port", str(port), "--max-model-len",
                "1024", "--log-level", "warning", "--engine-cpus", engine_cores(args.threads), *route]
    if kind == "vllm":
        return [args.peer_python, "-m", "vllm.entrypoints.openai.api_server", "--model", hf, "--dtype", variant,
                "--port", str(port), "--max-model-len", "1024", "--seed", "0"]
    return None  # llama.cpp's server takes text prompts only; transformers has none


def served(engine: str, args, gguf: str, hf: str | None, port: int) -> dict:
    cmd = server_command(engine, args, gguf, hf, port)
    if cmd is None:
        return {"error": "no OpenAI server that takes token-id prompts"}
    env = engine_env(args.threads)
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.time() + args.timeout
        while time.time() < deadline:
            if proc.poll() is not None:
                return {"error": f"server exited: {proc.stderr.read()[-400:]}"}
            try:  # /health answers 200 once the model is loaded (gh200rt, vLLM)
                if all(httpx.get(f"http://127.0.0.1:{port}{path}", timeout=2).status_code == 200
                       for path in ("/health", "/v1/models")):
                    break
            except httpx.HTTPError:
                pass
            time.sleep(2)
        else:
            return {"error": "server did not start in time"}
        load = argparse.ArgumentParser()
        serve.add_arguments(load)
        ns = load.parse_args([
            "--base-url", f"http://127.0.0.1:{port}", "--num-prompts", str(args.served_requests), "--input-len", "128",
            "--output-len", "64", "--max-concurrency", "8"])
        warm = argparse.Namespace(**{**vars(ns), "num_prompts": 2, "output_len": 4})
        asyncio.run(serve.load(warm))
        results, duration = asyncio.run(serve.load(ns))
        ok = [r for r in results if r.ok]
        tpots = sorted((r.e2e - r.ttft) / (r.output_tokens - 1) for r in ok if r.output_tokens > 1)
        ttfts = sorted(r.ttft for r in ok)
        if not tpots:
            return {"error": f"no request succeeded: {results[0].error}"}
        return {"served": sum(r.output_tokens for r in ok) / duration, "tpot_p50": tpots[len(tpots) // 2],
                "ttft_p50": ttfts[len(ttfts) // 2], "failed": len(results) - len(ok)}
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def print_table(engines: list[str], runs: list[dict], rows: list[str]) -> None:
    """One column per run of ``engines`` (``runs[i]`` is ``engines[i]``'s)."""
    results = dict(enumerate(runs))
    print("\n| work | " + " | ".join(engines) + " |")
    print("|---|" + "---|" * len(engines))
    def row(label: str, key: str) -> None:
        cells = [f"{results[i][key]:.1f}" if key in results[i] else "—" for i in range(len(engines))]
        print(f"| {label} | " + " | ".join(cells) + " |")
    if "single" in rows:
        row("single-stream decode, tok/s", "single")
    if "offline" in rows:
        row("offline, output tok/s", "offline")
    if "served" in rows:
        row("served, output tok/s", "served")
        print("| served, TPOT p50 / TTFT p50 (ms) | " + " | ".join(
            f"{1000 * results[i]['tpot_p50']:.0f} / {1000 * results[i]['ttft_p50']:.0f}"
            if "tpot_p50" in results[i] else "—" for i in range(len(engines))) + " |")
    for e, result in zip(engines, runs):
        for key in ("skipped", "error", "served_error"):
            if key in result:
                print(f"{e}: {key}: {result[key]}")


def print_medians(engines: list[str], runs: list[dict]) -> None:
    """For an engine named more than once: the median of its runs' figures."""
    for engine in dict.fromkeys(engines):
        mine = [r for e, r in zip(engines, runs) if e == engine]
        if len(mine) < 2:
            continue
        figures = {key: statistics.median(r[key] for r in mine if key in r)
                   for key in ("single", "offline", "served") if any(key in r for r in mine)}
        print(f"{engine}: median of {len(mine)} runs: " + ", ".join(f"{k} {v:.1f}" for k, v in figures.items()))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--engines", nargs="+", default=DEFAULT_ENGINES)
    which.add_argument("--routes", nargs="*", choices=list(peers_routes.ROUTES),
                       help="instead: single-stream decode of these gh200rt routes (none named: all) next to "
                            "transformers, in this process")
    parser.add_argument("--rows", nargs="+", default=["single", "offline", "served"],
                        choices=["single", "offline", "served"])
    parser.add_argument("--threads", type=int, default=None,
                        help="CPU threads of every engine (default 2; --routes: torch's choice)")
    parser.add_argument("--rounds", type=int, default=None, help="rounds per engine or route (default 2; --routes: 3)")
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--offline-tokens", type=int, default=32)
    parser.add_argument("--single-tokens", type=int, default=64)
    parser.add_argument("--served-requests", type=int, default=48)
    parser.add_argument("--tokens", type=int, default=48, help="--routes: greedy tokens per decode")
    parser.add_argument("--peer-python", default=os.environ.get("PEER_PYTHON", ".venv-peers/bin/python"),
                        help="interpreter of the peers' own environment (default: $PEER_PYTHON, else .venv-peers/ "
                             "beside the checkout, see docs/benchmarks/peers.md)")
    parser.add_argument("--work-dir", default=os.path.join(tempfile.gettempdir(), "gh200rt-bench-peers"))
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per engine")


def run(args) -> int:
    if args.routes is not None:
        args.routes = args.routes or list(peers_routes.ROUTES)
        args.rounds = 3 if args.rounds is None else args.rounds
        peers_routes.run_routes(args)
        return 0
    args.threads = 2 if args.threads is None else args.threads
    args.rounds = 2 if args.rounds is None else args.rounds
    run_engines(args)
    return 0


def run_engines(args) -> None:
    """Every engine of ``--engines`` in its own process (and behind its server), then the table."""
    os.makedirs(args.work_dir, exist_ok=True)
    gguf = smollm2_gguf()
    prompts = random_prompts(args.requests, 80, 150)
    available = {e: missing_reason(e, args.peer_python) for e in args.engines}
    needs_hf = any(e.partition(":")[0] in ("vllm", "transformers") and available[e] is None for e in args.engines)
    hf = hf_dir(args.work_dir, gguf, args.peer_python) if needs_hf else None
    spec = dict(gguf=gguf, hf_dir=hf, prompts=prompts, single_prompt=prompts[0], threads=args.threads,
                warmup_prompts=fresh_tokens(prompts[:2], seed=1000),
                round_prompts=[prompts] + [fresh_tokens(prompts, seed=1000 + r) for r in range(1, args.rounds)],
                rounds=args.rounds, rows=[r for r in args.rows if r != "served"], max_model_len=1024,
                kv_blocks=2048, offline_tokens=args.offline_tokens, single_tokens=args.single_tokens)
    print(f"{len(prompts)} prompts, {sum(map(len, prompts))} prompt tokens; threads {args.threads}; "
          f"load average {os.getloadavg()[0]:.1f} at start")
    runs: list[dict] = []     # one per entry of --engines (an engine named twice runs twice, alternated)
    for i, engine in enumerate(args.engines):
        if available[engine] is not None:
            runs.append({"skipped": available[engine]})
            continue
        start = time.time()
        result = run_worker(engine, spec, worker_command(engine, args.peer_python), args.timeout) \
            if spec["rows"] else {}
        if "served" in args.rows:
            got = served(engine, args, gguf, hf, 18700 + i)
            result.update({"served_error": got["error"]} if "error" in got else got)
        runs.append(result)
        print(f"{engine}: {json.dumps({k: v for k, v in result.items() if k != 'sample'})} "
              f"({time.time() - start:.0f} s)", flush=True)
    samples = {e: r["sample"] for e, r in zip(args.engines, runs) if "sample" in r}
    for e, sample in samples.items():
        same = [a == b for a, b in zip(sample, samples.get("gh200rt:fp32", sample))]
        print(f"{e}: first 16 greedy tokens of 4 prompts identical to gh200rt:fp32 for {sum(same)} of {len(same)}")
    print(f"load average {os.getloadavg()[0]:.1f} at end")
    print_table(args.engines, runs, args.rows)
    print_medians(args.engines, runs)
