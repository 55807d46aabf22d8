"""The CPU routes' resident forms at start-up: one decoder layer's linears converted into the route's form (oneDNN's
reordered fp32 beside the native rows, fbgemm's packed fp16, oneDNN's or the native tiles' bf16) one after the
other and side by side on 2..N threads (``backends.cpu.prepack.side_by_side``, and a tall fp16 weight's fbgemm
pieces too: what the weight store does), with the time a whole model of that shape would take.

    python -m gh200rt.bench kernel route-forms [--shape llama3-8b] [--routes fp16,fp32] [--workers 2,4] [--reps 3]

Weights are random (a form's time does not depend on the values); a route this machine cannot execute is skipped
with the reason. Prints the CPU model and the load average, since both move the figures.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from gh200rt.backends.cpu.native import load_native_ops
from gh200rt.backends.cpu.prepack import cpu_route_form, resident_linear_format, run_route_probes, side_by_side
from gh200rt.backends.cpu.routes import ROUTES, route_for, route_unavailable
from gh200rt.bench.kernel.quant_load import cpu_model
from gh200rt.bench.random_model import SHAPES


def layer_weights(shape: dict, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """One decoder layer's linears as the store holds them (q/k/v and gate/up fused)."""
    h, i = shape["hidden_size"], shape["intermediate_size"]
    heads, kv = shape["num_attention_heads"], shape["num_key_value_heads"]
    d = shape.get("head_dim", h // heads)
    gen = torch.Generator().manual_seed(0)
    shapes = {"qkv_proj": ((heads + 2 * kv) * d, h), "o_proj": (h, heads * d), "gate_up_proj": (2 * i, h),
              "down_proj": (h, i)}
    return {name: (torch.randn(*s, generator=gen) * 0.02).to(dtype) for name, s in shapes.items()}


def seconds(weights: dict, fmt: str, threads: int, reps: int) -> float:
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        with torch.inference_mode():
            side_by_side(weights, lambda name, w: cpu_route_form(w, fmt, gated=name == "gate_up_proj",
                                                                 threads=threads), threads)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--shape", default="llama3-8b", choices=[s for s in SHAPES if "moe" not in s])
    parser.add_argument("--routes", default=",".join(ROUTES), help=f"of {', '.join(ROUTES)}")
    parser.add_argument("--workers", default=str(max(2, len(os.sched_getaffinity(0)))),
                        help="thread counts to make the forms on side by side (one thread is the serial way)")
    parser.add_argument("--reps", type=int, default=3)


def run(args) -> int:
    shape = SHAPES[args.shape]
    layers = shape["num_hidden_layers"]
    print(f"{cpu_model()}, {len(os.sched_getaffinity(0))} CPUs usable, torch threads {torch.get_num_threads()}, "
          f"load average {os.getloadavg()[0]:.2f}; {args.shape}: one layer's four linears, {layers} layers")
    print(f"{'route':<6} {'form':<20} {'way':<22} {'ms/layer':>9} {'model s':>8} {'vs one by one':>13}")
    for name in args.routes.split(","):
        why_not = route_unavailable(name)
        if why_not is not None:
            print(f"{name:<6} skipped: {why_not}")
            continue
        route = route_for("auto", name)
        weights = layer_weights(shape, route.dtype)
        fmt = route.linear_format
        if fmt == "onednn-fp32":        # what resident_linear_format makes of it, less its per-shape probe
            fmt = "onednn-fp32+native" if load_native_ops() is not None else fmt
        else:
            fmt = resident_linear_format(None, fmt)
        run_route_probes(fmt)
        base = seconds(weights, fmt, 1, args.reps)
        rows = [("one by one", base)]
        rows += [(f"side by side, {w} threads", seconds(weights, fmt, w, args.reps))
                 for w in map(int, args.workers.split(",")) if w > 1]
        for way, t in rows:
            print(f"{name:<6} {fmt:<20} {way:<22} {t * 1e3:>9.1f} {t * layers:>8.1f} {base / t:>12.2f}x", flush=True)
    return 0
