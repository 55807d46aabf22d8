"""CPU weight-only matmul at decode shapes: achieved GB/s per host weight format and route, fp32 alongside.

Runs one decode step's worth of SmolLM2-135M decoder linears (30 layers x fused qkv, o, fused
gate/up, down; ~106 M weights, far larger than the caches) with M rows, for each format and CPU
route, and prints the weight bytes read per second next to the fp32 F.linear run measured in the
same process (routes interleaved, median of --reps) and the machine's copy bandwidth. Time per
step bounds decode tokens/s from the decoder linears alone (the fp32 lm_head comes on top).

Routes marked "(not wired)" are measured for reference only; the others are what
``RefLinear`` / ``OneDNNWeight`` / ``PackedWeight`` / ``HalfWeight`` run ("bf16 acts": the bf16 CPU route;
"native": the native quantized linear, ``kernels/cpu/quant_linear.c``, up to ``NATIVE_MAX_ROWS`` rows; "fp16
HalfWeight (default)": the native fp16 linear, ``kernels/cpu/f16_linear.c``, up to ``NATIVE_F16_MAX_ROWS`` rows,
fbgemm's fp16 GEMM above;
"torch fallback": the same weights where the native library cannot be built; "fp8 b128": e4m3 codes with a scale
per 128 x 128 block as DeepSeek ships them, through the native fp8 linear, ``kernels/cpu/fp8_linear.c``, up to
``NATIVE_F32_MAX_ROWS`` rows, against dequantizing the weight on every call as before it).

Usage: ``python -m gh200rt.bench kernel quant-cpu [--rows 1 8 64] [--reps 5] [--threads 2] [--skip-slow]``
"""
from __future__ import annotations

import argparse
import os
import time

import torch
import torch.nn.functional as F

from gh200rt.backends.cpu.linear import native_dense_linear
from gh200rt.backends.cpu.native import load_native_ops
from gh200rt.backends.cpu.prepack import OneDNNWeight
from gh200rt.backends.cpu.routes import route_for
from gh200rt.bench.rounds import alternate, seconds_of
from gh200rt.formats.pack import pack_weight, quantize_int4, quantize_int8
from gh200rt.formats.packed_layout import FP8_MAX
from gh200rt.formats.quantizers import fp8_blocks_from_checkpoint
from gh200rt.models.layers.dense import dense_linear

HIDDEN, KV, INTER, LAYERS = 576, 192, 1536, 30
SHAPES = [(HIDDEN + 2 * KV, HIDDEN), (HIDDEN, HIDDEN), (2 * INTER, HIDDEN), (HIDDEN, INTER)]  # (out, in)


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


def _without_native(weights) -> list:
    """Packed weights that take torch's path (what a machine without a C compiler runs)."""
    out = list(weights)
    for p in out:
        p.derived["native"] = False
    return out


def routes(dense: list[torch.Tensor], skip_slow: bool) -> dict[str, tuple[list, int]]:
    """name -> (list of (callable(x), K), weight bytes read per step)."""
    out = {}

    def add(name, fns, weights):
        out[name] = ([(fn, w.shape[1]) for fn, w in zip(fns, dense)], weights)

    add("fp32 F.linear (MKL)", [lambda x, w=w: F.linear(x, w) for w in dense], sum(w.nbytes for w in dense))
    add("fp32 dense_linear (default)", [lambda x, w=w: dense_linear(x, w) for w in dense],
        sum(w.nbytes for w in dense))
    bf16 = [w.bfloat16() for w in dense]
    add("bf16 F.linear, bf16 acts", [lambda x, w=w: F.linear(x.bfloat16(), w) for w in bf16],
        sum(w.nbytes for w in bf16))
    if route_for("bfloat16").linear_format is not None:  # oneDNN reorders bf16 only with AVX-512 / AVX-NE-CONVERT
        reordered = [OneDNNWeight(w) for w in bf16]
        add("bf16 OneDNNWeight (bf16 route)", [lambda x, o=o: o.linear(x.bfloat16()) for o in reordered],
            sum(w.nbytes for w in bf16))
    half = [pack_weight(w, "fp16") for w in dense]
    add("fp16 HalfWeight (default)", [h.linear for h in half], sum(h.weight.nbytes for h in half))
    add("fp16 HalfWeight, fbgemm", [lambda x, h=h: h.linear(x, native=False) for h in half],
        sum(h.weight.nbytes for h in half))
    add("fp16 F.linear, fp16 acts (not wired)", [lambda x, h=h: F.linear(x.half(), h.weight) for h in half],
        sum(h.weight.nbytes for h in half))
    int8 = [quantize_int8(w) for w in dense]
    int8_bytes = sum(p.nbytes for p in int8)
    add("int8 PackedWeight (native, fp32 acts)", [p.linear for p in int8], int8_bytes)
    add("int8 PackedWeight, torch fallback", [p.linear for p in _without_native(quantize_int8(w) for w in dense)],
        int8_bytes)
    add("int8 PackedWeight, bf16 acts", [lambda x, p=p: p.linear(x.bfloat16()) for p in int8], int8_bytes)
    add("int8 fbgemm, int8 acts (opt-in)", [quantize_int8(w, cpu_route="fbgemm").linear for w in dense], int8_bytes)
    int4 = [quantize_int4(w, 32) for w in dense]
    int4_bytes = sum(p.nbytes for p in int4)
    add("int4 g32 PackedWeight (native, fp32 acts)", [p.linear for p in int4], int4_bytes)
    add("int4 g32 PackedWeight, torch fallback", [p.linear for p in _without_native(quantize_int4(w, 32) for w in dense)],
        int4_bytes)
    add("int4 g32 PackedWeight, bf16 acts", [lambda x, p=p: p.linear(x.bfloat16()) for p in int4], int4_bytes)
    fp8 = [block_fp8(w) for w in dense]
    fp8_bytes = sum(p.nbytes for p in fp8)
    native_dense = native_dense_linear(load_native_ops()) if load_native_ops() is not None else dense_linear
    add("fp8 b128 PackedWeight (native, fp32 acts)", [p.linear for p in fp8], fp8_bytes)
    add("fp8 b128 PackedWeight, bf16 acts", [lambda x, p=p: p.linear(x.bfloat16()) for p in fp8], fp8_bytes)
    add("fp8 b128 dequantize per call (before)", [lambda x, p=p: native_dense(x, p.dequantize()) for p in fp8],
        fp8_bytes)
    if not skip_slow:
        add("int8 dequant+matmul", [lambda x, p=p: x @ p.dequantize().T for p in int8], int8_bytes)
    return out


def block_fp8(w: torch.Tensor, block: int = 128):
    """``w`` as a block-FP8 checkpoint holds it (DeepSeek-V3's 128 x 128 blocks of e4m3 codes, a scale each)."""
    n, k = w.shape
    pad = torch.zeros(-(-n // block) * block, -(-k // block) * block)
    pad[:n, :k] = w
    tiles = pad.view(pad.shape[0] // block, block, pad.shape[1] // block, block)
    scale_inv = tiles.abs().amax(dim=(1, 3)).clamp(min=1e-12) / FP8_MAX
    codes = (tiles / scale_inv[:, None, :, None]).view_as(pad)[:n, :k].to(torch.float8_e4m3fn)
    return fp8_blocks_from_checkpoint(codes.contiguous(), scale_inv, (block, block))


def time_routes(table: dict, x_by_k: dict, reps: int) -> dict[str, float]:
    """Median seconds per step of each route; routes alternated within every repetition."""
    for fns, _ in table.values():  # warm-up (also builds cached CPU layouts)
        for fn, k in fns:
            fn(x_by_k[k])

    def step(fns):
        return lambda _round: seconds_of(lambda: [fn(x_by_k[k]) for fn, k in fns])[0]
    times = alternate({name: step(fns) for name, (fns, _) in table.items()}, reps)
    return {name: sorted(t)[len(t) // 2] for name, t in times.items()}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rows", type=int, nargs="+", default=[1], help="M: tokens in the decode batch")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--skip-slow", action="store_true", help="leave out dequantize-then-matmul")


def run(args) -> int:
    torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    dense = make_weights(gen)
    table = routes(dense, args.skip_slow)
    print(f"memory copy bandwidth (read+write) in this run: {stream_bandwidth():.1f} GB/s; threads={args.threads}, "
          f"{sum(w.numel() for w in dense) / 1e6:.0f} M weights, load average {os.getloadavg()[0]:.1f}")
    for m in args.rows:
        x_by_k = {k: torch.randn(m, k, generator=gen) for k in (HIDDEN, INTER)}
        seconds = time_routes(table, x_by_k, args.reps)
        base = seconds["fp32 F.linear (MKL)"]
        print(f"\nM={m}\n{'format / route':<38} {'MB read':>8} {'ms/step':>8} {'GB/s':>7} {'vs fp32':>8} "
              f"{'steps/s':>8}")
        for name, (_, nbytes) in table.items():
            s = seconds[name]
            print(f"{name:<38} {nbytes / 1e6:>8.1f} {s * 1e3:>8.2f} {nbytes / s / 1e9:>7.1f} {base / s:>7.2f}x "
                  f"{1 / s:>8.1f}")
    print(f"\nload average {os.getloadavg()[0]:.1f} at end")
    return 0
