"""Host quantization at load: one decoder layer's linears per host format, as one call over each weight (the
former way) and in blocks of rows on 1..N threads (``kernels.quantizers.quantize_rows``, what the weight store
does), with the bf16 GB/s taken in and the time a whole model of that shape would take.

    python -m gh200rt.bench kernel quant-load [--shape llama3-8b] [--formats int8,int4,fp8] [--workers 2,4] [--reps 3]
    python -m gh200rt.bench kernel quant-load --engine-start [--shape llama3-8b --layers 4 | --checkpoint DIR]
        [--formats int8]

``--engine-start`` times whole engine starts instead (``LLMEngine.from_config`` with every layer streamed in
that host format, on a random checkpoint of the shape cut to ``--layers``, or ``--checkpoint DIR``): without the
slab cache, with it empty (quantize and write), and with it full (read back) — the time to the engine being
ready, the process's peak RSS and how many layers' dense weights were read from the checkpoint, each start in a
fresh process, in the same run.

The shapes are ``--random-model``'s (gh200rt/bench/random_model.py); weights are random bf16 (quantization time does not depend on
the values). Prints the CPU model and the load average, since both move the figures.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

from gh200rt.bench.random_model import SHAPES, write_random_checkpoint
from gh200rt.formats.quantizers import quantize_fp8, quantize_int4, quantize_int8, quantize_rows

WHOLE = {"int8": quantize_int8, "int4": quantize_int4, "fp8": quantize_fp8}


def layer_weights(shape: dict) -> list[torch.Tensor]:
    h, i = shape["hidden_size"], shape["intermediate_size"]
    heads, kv = shape["num_attention_heads"], shape["num_key_value_heads"]
    d = shape.get("head_dim", h // heads)
    shapes = [((heads + 2 * kv) * d, h), (h, heads * d), (2 * i, h), (h, i)]
    return [(torch.randn(*s) * 0.02).to(torch.bfloat16) for s in shapes]


def seconds(fn, weights: list[torch.Tensor], reps: int) -> float:
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        for w in weights:
            fn(w)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return "unknown CPU"


def one_start(model: str, fmt: str, cache: str | None) -> dict:
    """One engine start in this process: seconds to ready, the host slabs' GB and the process's peak RSS."""
    import resource

    from gh200rt.config import EngineConfig
    from gh200rt.engine.engine import LLMEngine
    config = EngineConfig.from_kwargs(model=model, offload="stream", host_weight_dtype=fmt,
                                      host_weight_cache_dir=cache, max_model_len=256, num_kv_blocks=64)
    start = time.perf_counter()
    engine = LLMEngine.from_config(config)
    took = time.perf_counter() - start
    deferred = engine.store.deferred
    out = dict(seconds=took, slab_gb=engine.store.host_slab_bytes() / 1e9,
               peak_rss_gb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9,
               layers_read=len(deferred.layers_loaded) if deferred is not None else None)
    engine.close()
    return out


def engine_starts(args) -> None:
    import json
    import subprocess
    import tempfile

    if args.checkpoint:
        model, what = args.checkpoint, args.checkpoint
    else:
        model = write_random_checkpoint(args.shape, os.path.join(args.model_dir, f"{args.shape}-{args.layers}l"),
                                        num_layers=args.layers)
        what = f"{args.shape} cut to {args.layers} layers"
    print(f"{cpu_model()}, {len(os.sched_getaffinity(0))} CPUs usable, load average {os.getloadavg()[0]:.2f}; "
          f"{what}, every layer streamed; each start in a fresh process")
    print(f"{'format':<7} {'start':<34} {'seconds':>8} {'slab GB':>8} {'peak RSS GB':>11} {'layers read':>11}")
    for fmt in args.formats.split(","):
        with tempfile.TemporaryDirectory(dir=args.model_dir) as cache_dir:
            for label, cache in (("no cache (quantize)", None), ("cache empty (quantize, write)", cache_dir),
                                 ("cache full (read back)", cache_dir)):
                argv = [sys.executable, "-m", "gh200rt.bench", "kernel", "quant-load", "--one-start",
                        json.dumps([model, fmt, cache])]
                proc = subprocess.run(argv, capture_output=True, text=True)
                if proc.returncode != 0:
                    print(f"{fmt:<7} {label:<34} failed (exit {proc.returncode}): {proc.stderr.strip()[-300:]}")
                    continue
                row = json.loads(proc.stdout.strip().splitlines()[-1])
                read = "all" if row["layers_read"] is None else row["layers_read"]
                print(f"{fmt:<7} {label:<34} {row['seconds']:>8.2f} {row['slab_gb']:>8.2f} "
                      f"{row['peak_rss_gb']:>11.2f} {read:>11}", flush=True)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--shape", default="llama3-8b", choices=[s for s in SHAPES if "moe" not in s])
    parser.add_argument("--formats", default="int8,int4,fp8")
    parser.add_argument("--workers", default=str(max(2, len(os.sched_getaffinity(0)))),
                        help="thread counts for the blocked way (one thread is one call: quantize_rows)")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--engine-start", action="store_true", help="time engine starts (see above)")
    parser.add_argument("--layers", type=int, default=4, help="--engine-start: layers of the random checkpoint")
    parser.add_argument("--model-dir", default="/tmp", help="--engine-start: where the random checkpoint goes")
    parser.add_argument("--one-start", help=argparse.SUPPRESS)   # [model, format, cache dir]: one start, JSON out
    parser.add_argument("--checkpoint", help="--engine-start: this checkpoint directory instead of a random one (e.g. "
                                             "the whole shape: scripts/random_checkpoint.py llama3-8b DIR)")


def run(args) -> int:
    if args.one_start:
        import json
        print(json.dumps(one_start(*json.loads(args.one_start))))
        return 0
    if args.engine_start:
        engine_starts(args)
        return 0
    shape = SHAPES[args.shape]
    weights = layer_weights(shape)
    layers = shape["num_hidden_layers"]
    nbytes = sum(w.nbytes for w in weights)
    print(f"{cpu_model()}, {len(os.sched_getaffinity(0))} CPUs usable, load average {os.getloadavg()[0]:.2f}; "
          f"{args.shape}: one layer {nbytes / 1e6:.0f} MB of bf16, {layers} layers")
    print(f"{'format':<7} {'way':<22} {'ms/layer':>9} {'GB/s in':>8} {'model s':>8} {'vs one call':>11}")
    for fmt in args.formats.split(","):
        base = seconds(WHOLE[fmt], weights, args.reps)
        rows = [("one call per weight", base)]
        for workers in (w for w in map(int, args.workers.split(",")) if w > 1):
            rows.append((f"blocks, {workers} thread(s)",
                         seconds(lambda w: quantize_rows(w, fmt, workers), weights, args.reps)))
        for way, t in rows:
            print(f"{fmt:<7} {way:<22} {t * 1e3:>9.1f} {nbytes / t / 1e9:>8.2f} {t * layers:>8.1f} "
                  f"{base / t:>10.2f}x", flush=True)
    return 0
