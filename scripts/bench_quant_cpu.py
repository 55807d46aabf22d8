"""CPU weight-only matmul at decode shapes: achieved GB/s per host weight format, fp32 baseline alongside.

Runs one decode step's worth of SmolLM2-135M decoder linears (30 layers x q, k, v, o, gate, up,
down; ~106 M weights, far larger than the caches) with M rows, for each format and CPU route, and
prints the weight bytes read per second next to the fp32 dense run measured in the same process and
the machine's memory bandwidth (--stream-gbs, ~28 GB/s measured here). Time per step bounds decode
tokens/s from the linears alone.

Usage: ``python scripts/bench_quant_cpu.py [--rows 1] [--reps 5] [--threads 2]``
"""
from __future__ import annotations

import argparse
import time

import torch

from gh200rt.kernels.quant import PackedWeight, quantize_int4, quantize_int8

HIDDEN, KV, INTER, LAYERS = 576, 192, 1536, 30
SHAPES = [(HIDDEN, HIDDEN), (KV, HIDDEN), (KV, HIDDEN), (HIDDEN, HIDDEN),
          (INTER, HIDDEN), (INTER, HIDDEN), (HIDDEN, INTER)]  # (out, in) per layer


def stream_bandwidth(nbytes: int = 1 << 28) -> float:
    """GB/s of a large copy (read + write), the memory roofline this run is held to."""
    src = torch.ones(nbytes // 4)
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - t)
    return 2 * nbytes / best / 1e9


def make_weights(gen: torch.Generator) -> list[torch.Tensor]:
    return [torch.randn(n, k, generator=gen) * 0.02 for _ in range(LAYERS) for n, k in SHAPES]


def time_step(fns, x_by_k: dict, reps: int) -> float:
    for fn, k in fns:  # warm-up (also builds any cached CPU layouts)
        fn(x_by_k[k])
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        for fn, k in fns:
            fn(x_by_k[k])
        times.append(time.perf_counter() - t)
    return sorted(times)[len(times) // 2]


def routes(dense: list[torch.Tensor]):
    """name -> (list of (callable(x), K), bytes read per step)."""
    out = {}
    for name, dtype in (("fp32 dense", torch.float32), ("bf16 dense", torch.bfloat16)):
        ws = [w.to(dtype) for w in dense]
        out[name] = ([((lambda x, w=w: torch.nn.functional.linear(x.to(w.dtype), w)), w.shape[1]) for w in ws],
                     sum(w.nbytes for w in ws))
    for name, quantize in (("int8 per-channel", quantize_int8), ("int4 g32", lambda w: quantize_int4(w, 32))):
        packed: list[PackedWeight] = [quantize(w) for w in dense]
        portable = sum(p.nbytes for p in packed)
        out[f"{name} torch op"] = ([(p.linear, p.shape[1]) for p in packed], portable)
        if name.startswith("int8"):
            fast = [quantize_int8(w, cpu_route="fbgemm") for w in dense]
            out[f"{name} fbgemm (int8 acts)"] = ([(p.linear, p.shape[1]) for p in fast], portable)
        out[f"{name} dequant+matmul"] = ([((lambda x, p=p: x @ p.dequantize().T), p.shape[1]) for p in packed], portable)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1, help="M: tokens in the decode batch")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    dense = make_weights(gen)
    x_by_k = {k: torch.randn(args.rows, k, generator=gen) for k in (HIDDEN, INTER)}
    stream = stream_bandwidth()
    print(f"memory copy bandwidth (read+write) in this run: {stream:.1f} GB/s; M={args.rows}, "
          f"threads={args.threads}, {sum(w.numel() for w in dense) / 1e6:.0f} M weights")
    print(f"{'format / route':<30} {'MB read':>8} {'ms/step':>8} {'GB/s':>7} {'vs fp32':>8} {'steps/s':>8}")
    base = None
    for name, (fns, nbytes) in routes(dense).items():
        seconds = time_step(fns, x_by_k, args.reps)
        base = base or seconds
        print(f"{name:<30} {nbytes / 1e6:>8.1f} {seconds * 1e3:>8.2f} {nbytes / seconds / 1e9:>7.1f} "
              f"{base / seconds:>7.2f}x {1 / seconds:>8.1f}")


if __name__ == "__main__":
    main()
