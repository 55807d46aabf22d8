"""Time decode's one-row products on a GPU: gemv (kernels/triton/gemv.py) per tile shape against cuBLAS and host_gemm.

    python -m gh200rt.bench kernel gemv [--json PATH] [--quick]

Llama-3-8B's products at M = 1 (qkv, o, gate_up, down and the 128256-row head):
(a) resident bf16 weights in HBM: cuBLAS (``F.linear``), host_gemm's tiled kernel (split K) and gemv at each tile of ``TILES``, next to a
    1 GiB device-to-device copy (read + write) measured in the same run;
(b) weights in pinned host memory, read in place over the link (int4 g32, int8 and bf16; quantized ones also with
    their scales in HBM, so only the codes cross): host_gemm's tiled kernel against gemv per tile, next to a 1 GiB pinned
    host -> device copy measured in the same run.
``triton.testing.do_bench`` medians with the L2 flushed between calls. GB/s count the bytes each call must read
(weights, scales and minimums where they live in the memory of the bound). ``err``: largest difference from the
float32 reference relative to its largest value. The last table is each case's fastest kernel.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from gh200rt.bench.kernel.gpu_bounds import measured_bounds, pinned, print_fastest
from gh200rt.bench.rounds import timed

SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336),
          "head": (128256, 4096)}
TILES = {"bf16": [(4, 512), (8, 256), (8, 512), (8, 1024), (16, 256), (16, 512), (32, 256)],
         "int8": [(8, 512), (16, 512), (16, 1024), (32, 512)],
         "int4": [(8, 512), (16, 512), (16, 1024), (32, 256), (32, 512)]}
HOST_FORMATS = ("int4", "int8", "bf16")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", help="write every row here")
    parser.add_argument("--quick", action="store_true",
                        help="qkv and down only, one tile per format besides the default")


def run(args) -> int:
    if not torch.cuda.is_available():
        print("kernel gemv: needs a CUDA GPU; nothing measured", file=sys.stderr)
        return 2
    from gh200rt.formats.pack import pack_weight
    from gh200rt.kernels.triton.gemv import GEMV_TILE, gemv
    from gh200rt.kernels.triton.host_gemm import tiled_host_gemm
    from gh200rt.kernels.triton.weight_operands import reference_host_gemm
    bounds = measured_bounds()
    print(f"{torch.cuda.get_device_name()}: link (pinned H2D copy) {bounds['link']:.1f} GB/s, "
          f"HBM (device copy) {bounds['hbm']:.0f} GB/s")
    shapes = {k: SHAPES[k] for k in ("qkv", "down")} if args.quick else SHAPES
    tiles = {fmt: t[:1] for fmt, t in TILES.items()} if args.quick else TILES
    rows = []
    print(f"{'layer':<8} {'W':<5} {'read from':<20} {'kernel':<18} {'us':>9} {'MB':>8} {'GB/s':>8} "
          f"{'of bound':>8} {'err':>8}")

    def record(layer, weights, where, kernel, fn, nbytes, bound, want):
        ms, out = timed(fn)
        err = ((out.float().reshape(want.shape) - want).abs().max() / want.abs().max()).item()
        gbs = nbytes / ms / 1e6
        rows.append(dict(layer=layer, weights=weights, read_from=where, kernel=kernel, us=ms * 1e3, bytes=nbytes,
                         gb_s=gbs, bound=bound, of_bound=gbs / bounds[bound], err=err))
        print(f"{layer:<8} {weights:<5} {where:<20} {kernel:<18} {ms * 1e3:9.1f} {nbytes / 1e6:8.1f} {gbs:8.1f} "
              f"{gbs / bounds[bound]:8.2f} {err:8.1e}", flush=True)

    gen = torch.Generator(device="cuda").manual_seed(0)
    for layer, (n, k) in shapes.items():
        dense = torch.randn(n, k, generator=gen, device="cuda", dtype=torch.bfloat16) * 0.02
        x = torch.randn(1, k, generator=gen, device="cuda", dtype=torch.bfloat16)
        want = reference_host_gemm(x, dense)
        record(layer, "bf16", "HBM", "cuBLAS", lambda: F.linear(x, dense), dense.nbytes, "hbm", want)
        record(layer, "bf16", "HBM", "host_gemm tiled", lambda: tiled_host_gemm(x, dense), dense.nbytes, "hbm", want)
        for tile in tiles["bf16"] + ([GEMV_TILE] if args.quick else []):
            record(layer, "bf16", "HBM", f"gemv {tile[0]}x{tile[1]}", lambda: gemv(x, dense, tile=tile),
                   dense.nbytes, "hbm", want)
        if layer == "head":
            continue
        for fmt in HOST_FORMATS:
            on_device = pack_weight(dense, fmt)
            want = reference_host_gemm(x, on_device)
            host = pinned(on_device)
            placements = [("host", host, host.nbytes)]
            if fmt != "bf16":
                placements.append(("host, scales in HBM", host.with_tensors({**on_device.tensors(),
                                                                               "qweight": host.qweight}),
                                   host.qweight.nbytes))
            for where, weight, nbytes in placements:
                record(layer, fmt, where, "host_gemm tiled", lambda: tiled_host_gemm(x, weight), nbytes, "link", want)
                for tile in tiles["bf16" if fmt == "bf16" else fmt]:
                    record(layer, fmt, where, f"gemv {tile[0]}x{tile[1]}", lambda: gemv(x, weight, tile=tile),
                           nbytes, "link", want)
    print_fastest(rows, kernel_width=18)
    if args.json:
        Path(args.json).write_text(json.dumps(dict(device=torch.cuda.get_device_name(), bounds_gb_s=bounds,
                                                   rows=rows), indent=1))
    return 0
