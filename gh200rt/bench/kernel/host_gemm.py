"""host_gemm on a CUDA GPU at Llama-3-8B's linear shapes: weights read in place from pinned host memory
against a baseline revision of the kernel, and resident bf16 weights against cuBLAS.

    python -m gh200rt.bench kernel host-gemm [--baseline REV | DIR] [--json PATH]

(a) The DIRECT tier: each layer's weight (int8 and fp8 per channel, int4 in groups of 32, bf16) in pinned host
memory, read over the link by this tree's ``host_gemm`` and by the baseline's (``git show
REV:kernels/triton/host_gemm.py``, or ``kernels/triton/host_gemm.py`` in older revisions, with the kernels beside it,
imported by path; default: the merge-base of HEAD and ``main``, else ``.baseline/kernels/`` holding those files, for
a copy of the tree without its git history; a directory holding them also works), and by this tree's with the
scales and
minimums in HBM (the codes alone cross the link). GB/s are the bytes read from host memory per second, next
to a pinned host -> device copy of 1 GiB measured in the same run.
(b) Resident bf16 weights in HBM at M <= 8: this tree's kernel (a Triton GEMV at M = 1) against cuBLAS
(``F.linear``), next to a 1 GiB device-to-device copy (read + write).

M = 1 and 8, bf16 activations, ``triton.testing.do_bench`` medians (L2 flushed between calls); a call slower
than ``SLOW_CALL_MS`` (the per-element scale loads of older kernels) is timed once instead. ``err`` is the
largest difference from the float32 reference relative to its largest value.
"""
from __future__ import annotations

import argparse
import json
import sys

import torch
import torch.nn.functional as F

from gh200rt.bench import baseline
from gh200rt.bench.kernel.gpu_bounds import LLAMA3_8B, measured_bounds, pinned
from gh200rt.bench.rounds import timed

ROWS = (1, 8)
HOST_FORMATS = ("int8", "int4", "fp8", "bf16")
BASELINE_DIR = baseline.CHECKOUT / ".baseline" / "kernels"   # a checkout without git history: the baseline's here


def default_baseline() -> str | None:
    """The merge-base of HEAD and main, else ``BASELINE_DIR`` where it holds host_gemm.py and quant.py (a copy of the
    tree that travelled without its git history), else None: no baseline column."""
    found = baseline.merge_base()
    if found is not None:
        return found
    return str(BASELINE_DIR) if baseline.holds_kernels(BASELINE_DIR, ("host_gemm", "quant")) else None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--baseline", help="git revision (or directory) of the baseline kernels' host_gemm.py "
                                           "(default: the merge-base of HEAD and main)")
    parser.add_argument("--json", help="also write every row, with the measured bounds, to this JSON file")


def run(args) -> int:
    if not torch.cuda.is_available():
        print("kernel host-gemm: needs a CUDA GPU (it times Triton kernels reading pinned host memory and "
              "HBM); nothing measured", file=sys.stderr)
        return 2
    from gh200rt.formats.pack import pack_weight
    from gh200rt.kernels.triton.host_gemm import host_gemm
    from gh200rt.kernels.triton.weight_operands import reference_host_gemm
    rev = args.baseline or default_baseline()
    base_gemm = base_quant = None
    if rev is not None:
        package = baseline.kernels_package(rev)
        base_gemm, base_quant = baseline.kernel_module(package, "host_gemm"), baseline.weight_formats(package)
    bounds = measured_bounds()
    print(f"{torch.cuda.get_device_name()}: link (pinned H2D copy) {bounds['link']:.1f} GB/s, "
          f"HBM (device copy) {bounds['hbm']:.0f} GB/s; baseline "
          + (rev if rev is not None else f"none (no git history and no {BASELINE_DIR}: pass --baseline REV|DIR)"))
    rows = []

    def record(layer, m, weights, where, kernel, fn, nbytes, bound, want):
        ms, out = timed(fn)
        err = ((out.float() - want).abs().max() / want.abs().max()).item()
        gbs = nbytes / ms / 1e6
        rows.append(dict(layer=layer, shape=LLAMA3_8B[layer], m=m, weights=weights, read_from=where, kernel=kernel,
                         ms=ms, bytes=nbytes, gb_s=gbs, bound=bound, of_bound=gbs / bounds[bound], err=err))
        print(f"{layer:<8} {m:>2} {weights:<5} {where:<22} {kernel:<10} {ms:9.3f} {nbytes / 1e6:9.1f} "
              f"{gbs:8.1f} {gbs / bounds[bound]:8.2f} {err:8.1e}", flush=True)

    print(f"{'layer':<8} {'M':>2} {'W':<5} {'read from':<22} {'kernel':<10} {'ms':>9} {'MB read':>9} "
          f"{'GB/s':>8} {'of bound':>8} {'err':>8}")
    gen = torch.Generator(device="cuda").manual_seed(0)
    for layer, (n, k) in LLAMA3_8B.items():
        dense = torch.randn(n, k, generator=gen, device="cuda", dtype=torch.bfloat16) * 0.02
        xs = {m: torch.randn(m, k, generator=gen, device="cuda", dtype=torch.bfloat16) for m in ROWS}
        for fmt in HOST_FORMATS:
            on_device = pack_weight(dense, fmt)
            want = {m: reference_host_gemm(xs[m], on_device) for m in ROWS}
            host = pinned(on_device)
            if fmt == "bf16":
                base, scales_in_hbm, code_bytes = host, None, host.nbytes
            else:
                base = None if base_quant is None else base_quant.PackedWeight(host.fmt, host.qweight, host.scale, host.minimum, host.group_size,
                                               host.shape)
                scales_in_hbm = host.with_tensors({**on_device.tensors(), "qweight": host.qweight})
                code_bytes = host.qweight.nbytes
            for m in ROWS:
                x = xs[m]
                if base_gemm is not None:
                    record(layer, m, fmt, "host", "baseline", lambda: base_gemm.host_gemm(x, base), host.nbytes,
                           "link", want[m])
                record(layer, m, fmt, "host", "this tree", lambda: host_gemm(x, host), host.nbytes, "link", want[m])
                if scales_in_hbm is not None:
                    record(layer, m, fmt, "host, scales in HBM", "this tree", lambda: host_gemm(x, scales_in_hbm),
                           code_bytes, "link", want[m])
        for m in ROWS:
            x, want = xs[m], reference_host_gemm(xs[m], dense)
            record(layer, m, "bf16", "HBM", "cuBLAS", lambda: F.linear(x, dense), dense.nbytes, "hbm", want)
            record(layer, m, "bf16", "HBM", "this tree", lambda: host_gemm(x, dense), dense.nbytes, "hbm", want)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), baseline=rev, bounds_gb_s=bounds, rows=rows), f,
                      indent=1)
    return 0
