"""Time decode's few-row products (batch 2-8) on a GPU: host_gemm's tiled kernel per tile, pipeline depth and
K split, against cuBLAS (resident bf16) and against the kernel's own choice (weights in host memory).

    python -m gh200rt.bench kernel skinny [--rows 8] [--formats bf16,int8,int4] [--layers qkv,o,gate_up,down]
        [--deeper] [--fused] [--json PATH]

On an H100 (docs/BENCHMARKS.md) resident decode at batch 8 ran at 0.64-0.70 of its roofline, cuBLAS reaching
0.49-0.81 of HBM on Llama-3-8B's products at M = 8 and the tiled kernel (16x64x64 tiles, split K) 0.38-0.76. This
sweep is what picks ``tile_config``'s M > 1 tiles and whether resident few-row products leave cuBLAS:
(a) resident bf16 weights: cuBLAS (``F.linear``) and the tiled kernel at every (BLOCK_N, BLOCK_K, stages, split)
    of ``VARIANTS`` (``--deeper``: 4 stages too), next to a 1 GiB device-to-device copy (read + write);
(b) weights in pinned host memory (int8 per channel, int4 g32 with its scales in HBM): the kernel's own choice
    (``tiled_host_gemm``) and every variant, next to a 1 GiB pinned host -> device copy.
``triton.testing.do_bench`` medians, L2 flushed between calls; ``err`` against the float32 reference. The last
table is each case's fastest variant.
"""
from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
from triton.runtime.errors import OutOfResources

from gh200rt.bench.commands import UsageError
from gh200rt.bench.kernel.gpu_bounds import LLAMA3_8B, measured_bounds, pinned, print_fastest
from gh200rt.bench.rounds import timed

# (BLOCK_N, BLOCK_K, num_stages, split): split "auto" is choose_split_k's, 1 none
VARIANTS = list(itertools.product((32, 64, 128), (64, 128, 256), (3,), ("auto", 1)))
DEEPER = [(bn, bk, 4, split) for bn, bk, _, split in VARIANTS]   # --stages 4 too
FORMATS = ("bf16", "int8", "int4")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rows", type=int, default=8, help="rows of x (2-16)")
    parser.add_argument("--formats", default=",".join(FORMATS),
                        help="of bf16 (resident in HBM), int8, int4 (codes in host memory, scales in HBM)")
    parser.add_argument("--layers", default=",".join(LLAMA3_8B), help=f"of {', '.join(LLAMA3_8B)}")
    parser.add_argument("--deeper", action="store_true", help="also every variant with 4 pipeline stages")
    parser.add_argument("--json", help="write every row here")
    parser.add_argument("--fused", action="store_true",
                        help="resident bf16: kernels/triton/fused_rows.py (no K split, the decode layer's fused products) at "
                             "every tile of its SWEEP_TILES instead of the tiled kernel's variants, against cuBLAS; --rows up "
                             "to 64 then")


def tiled_variant(x: torch.Tensor, weight, block_n: int, block_k: int, stages: int, split):
    """host_gemm's tiled kernel over ``weight`` at one tile, pipeline depth and K split (``tiled_host_gemm``'s
    launch with these instead of ``tile_config``'s)."""
    from gh200rt.kernels import host_gemm as hg
    n, k = weight.shape
    m = x.shape[0]
    fmt, w, scale, minimum, group = hg.weight_operands(weight, x)
    bits = 4 if fmt == hg.FMT_INT4 else 8 * w.element_size()
    scales = hg.scale_mode(fmt, group, k, bits)
    cfg = dict(USE_DOT=True, BLOCK_M=16, BLOCK_N=block_n, BLOCK_K=block_k)
    if scales == hg.PER_TILE and group % block_k:
        return None                         # a K tile would straddle two groups
    splits = hg.choose_split_k(m, n, k, cfg) if split == "auto" else split
    k_per_split = triton.cdiv(triton.cdiv(k, splits), block_k) * block_k
    splits = triton.cdiv(k, k_per_split)
    atomic = splits > 1

    def run():
        y = (torch.zeros if atomic else torch.empty)((m, n), dtype=torch.float32 if atomic else x.dtype,
                                                     device=x.device)
        hg.host_gemm_kernel[(triton.cdiv(n, block_n), splits, 1)](
            x, w, scale, minimum, x, y, m, n, k, w.shape[1], x.stride(0), w.stride(0), scale.stride(0), y.stride(0),
            group, k_per_split // 2 if fmt == hg.FMT_INT4 else k_per_split, FMT=fmt, SCALES=scales, HAS_BIAS=False,
            ATOMIC=atomic, num_warps=hg.NUM_WARPS, num_stages=stages, **cfg)
        return y.to(x.dtype) if atomic else y
    return run


def run(args) -> int:
    if not torch.cuda.is_available():
        print("kernel skinny: needs a CUDA GPU; nothing measured", file=sys.stderr)
        return 2
    if not 2 <= args.rows <= (64 if args.fused else 16):
        raise UsageError(f"--rows {args.rows}: choose 2-16, or 2-64 with --fused (one row is kernel gemv's, more "
                         f"is a prefill's)")
    from gh200rt.formats.pack import pack_weight
    from gh200rt.kernels.triton.host_gemm import tiled_host_gemm
    from gh200rt.kernels.triton.weight_operands import reference_host_gemm
    bounds = measured_bounds()
    print(f"{torch.cuda.get_device_name()}: link (pinned H2D copy) {bounds['link']:.1f} GB/s, "
          f"HBM (device copy) {bounds['hbm']:.0f} GB/s; M = {args.rows}")
    print(f"{'layer':<8} {'W':<5} {'read from':<20} {'kernel':<24} {'us':>9} {'GB/s':>8} {'of bound':>8} {'err':>8}")
    rows = []

    def record(layer, weights, where, kernel, fn, nbytes, bound, want):
        ms, out = timed(fn)
        err = ((out.float() - want).abs().max() / want.abs().max()).item()
        gbs = nbytes / ms / 1e6
        rows.append(dict(layer=layer, m=args.rows, weights=weights, read_from=where, kernel=kernel, us=ms * 1e3,
                         bytes=nbytes, gb_s=gbs, bound=bound, of_bound=gbs / bounds[bound], err=err))
        print(f"{layer:<8} {weights:<5} {where:<20} {kernel:<24} {ms * 1e3:9.1f} {gbs:8.1f} "
              f"{gbs / bounds[bound]:8.2f} {err:8.1e}", flush=True)

    variants = VARIANTS + (DEEPER if args.deeper else [])
    formats = args.formats.split(",")
    unknown = [f for f in formats if f not in FORMATS] + [n for n in args.layers.split(",") if n not in LLAMA3_8B]
    if unknown:
        raise UsageError(f"unknown --formats/--layers value(s) {unknown}")

    def sweep(layer, weights, where, x, weight, nbytes, bound, want):
        for bn, bk, stages, split in variants:
            fn = tiled_variant(x, weight, bn, bk, stages, split)
            if fn is None:
                continue
            try:
                record(layer, weights, where, f"tiled {bn}x{bk} s{stages} k{split}", fn, nbytes, bound, want)
            except OutOfResources as exc:   # the tile's pipeline does not fit the SM's shared memory
                print(f"{layer:<8} {weights:<5} {where:<20} tiled {bn}x{bk} s{stages} k{split}: {exc}", flush=True)

    def fused_sweep(layer, weights, where, x, dense, nbytes, bound, want):
        from gh200rt.kernels.triton.fused_rows import SWEEP_TILES, block_rows, fused_rows
        for bn, bk, warps, dot_16bit in SWEEP_TILES[block_rows(args.rows)]:
            label = f"fused_rows {bn}x{bk} w{warps}" + (" bf16-dot" if dot_16bit else "")
            tile = dict(BLOCK_N=bn, BLOCK_K=bk, num_warps=warps, DOT_16BIT=dot_16bit)
            try:
                record(layer, weights, where, label, lambda: fused_rows(x, dense, tile=tile), nbytes, bound, want)
            except OutOfResources as exc:
                print(f"{layer:<8} {weights:<5} {where:<20} {label}: {exc}", flush=True)

    gen = torch.Generator(device="cuda").manual_seed(0)
    for layer in args.layers.split(","):
        n, k = LLAMA3_8B[layer]
        dense = torch.randn(n, k, generator=gen, device="cuda", dtype=torch.bfloat16) * 0.02
        x = torch.randn(args.rows, k, generator=gen, device="cuda", dtype=torch.bfloat16)
        if "bf16" in formats:
            want = reference_host_gemm(x, dense)
            record(layer, "bf16", "HBM", "cuBLAS", lambda: F.linear(x, dense), dense.nbytes, "hbm", want)
            (fused_sweep if args.fused else sweep)(layer, "bf16", "HBM", x, dense, dense.nbytes, "hbm", want)
        for fmt in [f for f in formats if f != "bf16"]:
            on_device = pack_weight(dense, fmt)
            host = pinned(on_device)
            weight = host.with_tensors({**on_device.tensors(), "qweight": host.qweight})   # scales in HBM
            want = reference_host_gemm(x, on_device)
            where = "host, scales in HBM"
            record(layer, fmt, where, "tiled (its own choice)", lambda: tiled_host_gemm(x, weight),
                   host.qweight.nbytes, "link", want)
            sweep(layer, fmt, where, x, weight, host.qweight.nbytes, "link", want)
    print_fastest(rows, kernel_width=24)
    if args.json:
        Path(args.json).write_text(json.dumps(dict(device=torch.cuda.get_device_name(), rows_of_x=args.rows,
                                                   bounds_gb_s=bounds, rows=rows), indent=1))
    return 0
