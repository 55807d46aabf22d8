"""host_gemm on a CUDA GPU at Llama-3-8B's linear shapes: weights read in place from pinned host memory
against a baseline revision of the kernel, and resident bf16 weights against cuBLAS.

    python scripts/bench_gpu_host_gemm.py [--baseline REV | DIR] [--json PATH]

(a) The DIRECT tier: each layer's weight (int8 and fp8 per channel, int4 in groups of 32, bf16) in pinned host
memory, read over the link by this tree's ``host_gemm`` and by the baseline's (``git show
REV:kernels/triton/host_gemm.py`` with the ``kernels/*.py`` beside it, imported by path; default: the merge-base of
HEAD and ``main``, else ``.baseline/kernels/`` holding those files, for a copy of the tree without its git history;
a directory holding them also works), and by this tree's with the scales and
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
import importlib
import importlib.util
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
LLAMA3_8B = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}
ROWS = (1, 8)
HOST_FORMATS = ("int8", "int4", "fp8", "bf16")
SLOW_CALL_MS = 50.0
BOUND_BYTES = 1 << 30


def load_baseline(rev: str):
    """(host_gemm module, quant module) of ``rev`` (a git revision, or a directory with its ``kernels/*.py``)."""
    name = load_baseline_package(rev)
    return importlib.import_module(f"{name}.host_gemm"), importlib.import_module(f"{name}.quant")


def load_baseline_package(rev: str) -> str:
    """The name of a package holding ``rev``'s ``kernels/*.py`` (a git revision, or a directory of them): every
    top-level module is copied, as the kernels import their neighbours (weight formats, the attention walk)."""
    package = Path(tempfile.mkdtemp(prefix="kernels_baseline_")) / "baseline_kernels"
    package.mkdir()
    for name in _baseline_modules(rev):
        if Path(rev).is_dir():
            text = (Path(rev) / name).read_text()
        else:
            shown = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:kernels/{name}"],
                                   capture_output=True, text=True, check=False)
            if shown.returncode:
                raise SystemExit(f"--baseline {rev}: cannot read kernels/{name} there: {shown.stderr.strip()}")
            text = shown.stdout
        (package / name).write_text(text)
    (package / "__init__.py").write_text("")
    name = package.parent.name    # unique per load: a second baseline is not the first one's cached modules
    spec = importlib.util.spec_from_file_location(name, package / "__init__.py",
                                                  submodule_search_locations=[str(package)])
    sys.modules[name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sys.modules[name])
    return name


def _baseline_modules(rev: str) -> list[str]:
    """The names of ``rev``'s top-level ``kernels/*.py`` modules (its ``__init__.py`` aside)."""
    if Path(rev).is_dir():
        names = [path.name for path in Path(rev).glob("*.py")]
    else:
        listed = subprocess.run(["git", "-C", str(ROOT), "ls-tree", "--name-only", rev, "kernels/"],
                                capture_output=True, text=True, check=False)
        if listed.returncode:
            raise SystemExit(f"--baseline {rev}: cannot list kernels/ there: {listed.stderr.strip()}")
        names = [Path(line).name for line in listed.stdout.split()]
    return sorted(name for name in names if name.endswith(".py") and name != "__init__.py")


BASELINE_DIR = ROOT / ".baseline" / "kernels"   # a checkout without git history: the baseline's kernels/*.py here


def default_baseline() -> str | None:
    """The merge-base of HEAD and main, else ``BASELINE_DIR`` where it holds host_gemm.py and quant.py (a copy of the
    tree that travelled without its git history), else None: no baseline column."""
    found = subprocess.run(["git", "-C", str(ROOT), "merge-base", "HEAD", "main"], capture_output=True, text=True,
                           check=False)
    if found.returncode == 0 and found.stdout.strip() != _head():
        return found.stdout.strip()
    if all((BASELINE_DIR / name).is_file() for name in ("host_gemm.py", "quant.py")):
        return str(BASELINE_DIR)
    return None


def _head() -> str:
    found = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, check=False)
    return found.stdout.strip()


def timed(fn) -> tuple[float, torch.Tensor]:
    """(median ms of ``fn``, its output). A call slower than ``SLOW_CALL_MS`` is timed once: the per-element
    scale loads of older kernels take seconds per call on the largest layers."""
    import triton.testing
    out = fn()                             # compiles
    torch.cuda.synchronize()
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    fn()
    end.record()
    end.synchronize()
    once = begin.elapsed_time(end)
    if once > SLOW_CALL_MS:
        return once, out
    return triton.testing.do_bench(fn, warmup=10, rep=50, return_mode="median"), out


def print_fastest(rows: list[dict], kernel_width: int) -> None:
    """The fastest row of each (layer, weights, read_from) case: bench_gpu_gemv.py's and bench_gpu_skinny.py's
    last table (rows with ``kernel``, ``us`` and ``of_bound``)."""
    print("\nfastest per case")
    best: dict[tuple, dict] = {}
    for row in rows:
        key = (row["layer"], row["weights"], row["read_from"])
        if key not in best or row["us"] < best[key]["us"]:
            best[key] = row
    for (layer, weights, where), row in best.items():
        print(f"{layer:<8} {weights:<5} {where:<20} {row['kernel']:<{kernel_width}} {row['us']:9.1f} us "
              f"{row['of_bound']:5.2f} of bound")


def measured_bounds() -> dict[str, float]:
    """GB/s of the two limits: a pinned host -> device copy (the link) and a device copy (HBM, read + write)."""
    host = torch.empty(BOUND_BYTES, dtype=torch.uint8, pin_memory=True)
    device = torch.empty(BOUND_BYTES, dtype=torch.uint8, device="cuda")
    other = torch.empty_like(device)
    link = BOUND_BYTES / timed(lambda: device.copy_(host, non_blocking=True))[0] / 1e6
    hbm = 2 * BOUND_BYTES / timed(lambda: other.copy_(device))[0] / 1e6
    return {"link": link, "hbm": hbm}


def pinned(weight):
    """``weight`` (a device tensor or PackedWeight) in pinned host memory."""
    def move(t: torch.Tensor) -> torch.Tensor:
        return torch.empty(t.shape, dtype=t.dtype, pin_memory=True).copy_(t)
    if isinstance(weight, torch.Tensor):
        return move(weight)
    return weight.with_tensors({name: move(t) for name, t in weight.tensors().items()})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--baseline", help="git revision (or directory) of the baseline kernels/triton/host_gemm.py "
                                           "(default: the merge-base of HEAD and main)")
    parser.add_argument("--json", help="also write every row, with the measured bounds, to this JSON file")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("bench_gpu_host_gemm: needs a CUDA GPU (it times Triton kernels reading pinned host memory and "
              "HBM); nothing measured", file=sys.stderr)
        return 2
    from gh200rt.formats.pack import pack_weight
    from gh200rt.kernels.triton.host_gemm import host_gemm
    from gh200rt.kernels.triton.weight_operands import reference_host_gemm
    rev = args.baseline or default_baseline()
    base_gemm, base_quant = load_baseline(rev) if rev is not None else (None, None)
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


if __name__ == "__main__":
    sys.exit(main())
