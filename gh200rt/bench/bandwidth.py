"""How fast each reader gets at host memory placed each way.

For every placement (local bind, remote bind, interleave, default first touch) and every reader
this machine has (CPU threads; GPU copy engine host->device; a GPU kernel summing host memory in
place; host_gemm, the DIRECT tier's kernel, reading it in place as a bf16 weight for one token) it
measures bandwidth over sizes from 1 MiB to 1 GiB (repeats: median, min-max), writes JSON (first)
and a PNG plot (when matplotlib is installed), and prints a table with each figure next to the
machine's published limit (../shared HARDWARE.md figures) where one is known.

    python -m gh200rt.bench bandwidth --list      # what would run here, and why the rest is skipped
    python -m gh200rt.bench bandwidth --quick     # under a minute
    python -m gh200rt.bench bandwidth --out results/numa --repeats 7
    python -m gh200rt.bench bandwidth --readers gpu-copy-h2d,gpu-host-gemm --sizes-mib 64 256 1024 \
        --profile-out results/profile.json   # also a measured profile for the planner (--profile-file)

``--profile-out`` writes the GPU readers' figures and the cores' (cpu-linear, cpu-gemm: what a cpu-tier expert costs;
largest buffer on the GPU's node) as a measured profile
(gh200rt/platform/bandwidth.py) that ``python -m gh200rt.serve --profile-file PATH`` (and every command
taking engine flags) plans with on this host instead of the built-in table.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import torch

from gh200rt.bench.commands import UsageError
from gh200rt.numa.alloc import allocate
from gh200rt.numa.topology import Topology, read_topology

MIB = 1 << 20
FULL_SIZES = [1 * MIB, 4 * MIB, 16 * MIB, 64 * MIB, 256 * MIB, 1024 * MIB]
QUICK_SIZES = [1 * MIB, 16 * MIB, 64 * MIB]

# (machine, reader, placement) -> (GB/s, source); HARDWARE.md.
LIMITS = {
    ("gh200", "gpu-copy-h2d", "local-bind"): (375.0, "KTH arXiv 2407.07850, H2D pinned"),
    ("gh200", "gpu-copy-h2d", "remote-bind"): (133.0, "dnhkng part 1, remote Grace node"),
    ("gh200", "gpu-kernel-direct", "local-bind"): (330.0, "dnhkng part 1, ATS local node"),
    ("gh200", "gpu-kernel-direct", "remote-bind"): (221.0, "dnhkng part 1, ATS other socket"),
    ("gh200", "cpu-threads", "local-bind"): (486.0, "KTH STREAM on LPDDR5X"),
    ("x86-cuda", "gpu-copy-h2d", "local-bind"): (55.0, "PCIe Gen5 x16 pinned, common measurements"),
    ("x86-cuda", "gpu-kernel-direct", "local-bind"): (35.0, "nvbandwidth issue 24, SM-driven H2D"),
    ("gh200", "gpu-host-gemm", "local-bind"): (330.0, "dnhkng part 1, ATS local node"),
    ("gh200", "gpu-host-gemm", "remote-bind"): (221.0, "dnhkng part 1, ATS other socket"),
    ("x86-cuda", "gpu-host-gemm", "local-bind"): (35.0, "nvbandwidth issue 24, SM-driven H2D"),
}
HOST_GEMM_K = 4096  # the weight's row length in the host_gemm reader (a Llama-3-8B hidden size)


@dataclass(frozen=True)
class Placement:
    name: str
    policy: str
    node: int | None


def machine_kind(topo: Topology) -> str:
    if not torch.cuda.is_available():
        return "cpu"
    return "gh200" if any(g.memory_node is not None for g in topo.gpus) else "x86-cuda"


def placements(topo: Topology, gpu_node: int) -> tuple[list[Placement], list[str]]:
    chosen = [Placement("local-bind", "bind", gpu_node)]
    skipped = []
    remote = [n.id for n in topo.cpu_nodes if n.id != gpu_node]
    if remote:
        chosen.append(Placement("remote-bind", "bind", remote[0]))
    else:
        skipped.append("remote-bind: this machine has a single CPU node")
    chosen += [Placement("interleave", "interleave", None), Placement("first-touch", "default", None)]
    return chosen, skipped


def readers() -> tuple[dict, list[str]]:
    available = {"cpu-threads": read_cpu, "cpu-linear": read_cpu_linear, "cpu-gemm": read_cpu_gemm}
    skipped = []
    if torch.cuda.is_available():
        available["gpu-copy-h2d"] = read_gpu_copy
        try:
            import triton  # noqa: F401
            available["gpu-kernel-direct"] = read_gpu_direct
            available["gpu-host-gemm"] = read_gpu_host_gemm
        except ImportError:
            skipped.append("gpu-kernel-direct, gpu-host-gemm: triton is not installed")
    else:
        skipped += [f"{name}: no CUDA GPU visible (torch.cuda.is_available() is False)"
                    for name in ("gpu-copy-h2d", "gpu-kernel-direct", "gpu-host-gemm")]
    return available, skipped


READERS = ("cpu-threads", "cpu-linear", "cpu-gemm", "gpu-copy-h2d", "gpu-kernel-direct", "gpu-host-gemm")
# rows of the cpu-gemm reader: a prefill's many tokens to one expert, where the cores' arithmetic bounds the time
CPU_GEMM_ROWS = 64


def read_cpu(buf) -> float:
    """Seconds for all CPU threads to read the buffer once (a sum over 8-byte words).

    Small buffers are read several times per sample so call overhead does not dominate.
    """
    words = buf.tensor[: buf.nbytes // 8 * 8].view(torch.int64)
    passes = max(1, (64 * MIB) // buf.nbytes)
    start = time.perf_counter()
    for _ in range(passes):
        words.sum()
    return (time.perf_counter() - start) / passes


def _cpu_weight(buf) -> torch.Tensor:
    rows = buf.nbytes // (HOST_GEMM_K * 2)
    return buf.tensor[: rows * HOST_GEMM_K * 2].view(torch.bfloat16).view(rows, HOST_GEMM_K)


def _time_cpu_linear(buf, rows: int) -> float:
    from gh200rt.models.layers.dense import dense_linear
    weight = _cpu_weight(buf)
    x = torch.randn(rows, HOST_GEMM_K, dtype=torch.bfloat16)
    passes = max(1, (64 * MIB) // buf.nbytes)
    with torch.inference_mode():
        start = time.perf_counter()
        for _ in range(passes):
            dense_linear(x, weight)
        seconds = (time.perf_counter() - start) / passes
    return seconds * buf.nbytes / weight.nbytes     # per byte of the buffer


def read_cpu_linear(buf) -> float:
    """The host's cores multiply one row by the buffer read in place as a bf16 ``[N, 4096]`` weight (the dense
    linear the CPU backend runs): a cpu-tier expert's decode (``host_cpu_gbps``)."""
    return _time_cpu_linear(buf, 1)


def read_cpu_gemm(buf) -> float:
    """The same weight times ``CPU_GEMM_ROWS`` rows: the cores' arithmetic (``host_cpu_tflops``: bf16 bytes x rows
    flops per pass)."""
    return _time_cpu_linear(buf, CPU_GEMM_ROWS)


def read_gpu_copy(buf) -> float:
    buf.register_cuda(mapped=False) if not buf.cuda_registered else None
    dst = torch.empty(buf.nbytes, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    start = time.perf_counter()
    dst.copy_(buf.tensor, non_blocking=True)
    torch.cuda.synchronize()
    return time.perf_counter() - start


def read_gpu_direct(buf) -> float:
    """A Triton kernel sums host memory in place (ATS on GH200; the mapped pointer on x86)."""
    from gh200rt.kernels.triton.host_read import sum_host_bytes
    buf.register_cuda(mapped=True) if not buf.cuda_registered else None
    torch.cuda.synchronize()
    start = time.perf_counter()
    sum_host_bytes(buf)
    torch.cuda.synchronize()
    return time.perf_counter() - start


@cache
def _gpu_platform():
    from gh200rt.platform.detect import detect
    return detect()


def read_gpu_host_gemm(buf) -> float:
    """host_gemm reads the buffer in place as a bf16 ``[N, 4096]`` weight for one token (decode's GEMV):
    the bytes the DIRECT tier moves per layer, through the kernel that moves them."""
    from gh200rt.kernels.triton.host_gemm import host_gemm
    from gh200rt.weights.device_view import device_view, prepare_slab_for_device
    platform = _gpu_platform()
    if not buf.cuda_registered:
        prepare_slab_for_device(buf, platform)
    rows = buf.nbytes // (HOST_GEMM_K * 2)
    weight = device_view(buf, platform, "cuda")[: rows * HOST_GEMM_K * 2].view(torch.bfloat16).view(rows, HOST_GEMM_K)
    x = torch.randn(1, HOST_GEMM_K, device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()
    start = time.perf_counter()
    host_gemm(x, weight)
    torch.cuda.synchronize()
    return (time.perf_counter() - start) * buf.nbytes / (rows * HOST_GEMM_K * 2)  # per byte of the buffer


def measure(placement: Placement, reader, size: int, repeats: int) -> dict:
    buf = allocate(size, node=placement.node, policy=placement.policy)
    try:
        reader(buf)  # warm-up: page tables, registration, kernel compile
        seconds = [reader(buf) for _ in range(repeats)]
    finally:
        buf.free()
    gbps = sorted(size / s / 1e9 for s in seconds)
    return {"bytes": size, "median_gbps": statistics.median(gbps), "min_gbps": gbps[0], "max_gbps": gbps[-1],
            "repeats": repeats}


def plot(results: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 5))
    for key in sorted({(r["reader"], r["placement"]) for r in results}):
        rows = [r for r in results if (r["reader"], r["placement"]) == key]
        x = [r["bytes"] / MIB for r in rows]
        ax.plot(x, [r["median_gbps"] for r in rows], marker="o", label=f"{key[0]} / {key[1]}")
        ax.fill_between(x, [r["min_gbps"] for r in rows], [r["max_gbps"] for r in rows], alpha=0.15)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("buffer size (MiB)")
    ax.set_ylabel("GB/s (median, min-max band)")
    ax.set_title("Host memory read bandwidth by placement and reader")
    ax.legend(fontsize=8)
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_profile(report: dict, path: Path) -> bool:
    """The measured profile of this host from ``report``; False (and why) when no GPU reader ran."""
    from gh200rt.platform.bandwidth import profile_from_bandwidth_report, write_measured_profile
    platform = _gpu_platform()
    command = "python -m gh200rt.bench " + " ".join(sys.argv[1:])
    profile = profile_from_bandwidth_report(report, platform.profile, platform.device_name, command)
    measured = {k: v for k, v in profile.items() if k.endswith(("_gbps", "_tflops"))}
    if not measured:
        print(f"no profile written to {path}: none of gpu-copy-h2d, gpu-host-gemm, cpu-linear, cpu-gemm ran on the "
              f"local node here "
              f"(readers skipped: {'; '.join(report['skipped']) or 'none'})", file=sys.stderr)
        return False
    write_measured_profile(path, profile)
    print(f"wrote {path}: measured profile over {platform.profile} "
          f"({', '.join(f'{k} {v}' for k, v in measured.items())}); plan with it: --profile-file {path}")
    return True


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--list", action="store_true", help="show what would run here and why the rest is skipped")
    parser.add_argument("--quick", action="store_true", help="3 sizes up to 64 MiB, 3 repeats (under a minute)")
    parser.add_argument("--sizes-mib", type=int, nargs="+", help="buffer sizes in MiB (default 1..1024)")
    parser.add_argument("--repeats", type=int, default=None, help="timed repeats per point (default 5, quick 3)")
    parser.add_argument("--readers", default=",".join(READERS),
                        help=f"comma-separated readers to run where available (default: all of {', '.join(READERS)})")
    parser.add_argument("--no-plot", action="store_true", help="write the JSON only")
    parser.add_argument("--gpu", type=int, default=0, help="which GPU's nearest node counts as local")
    parser.add_argument("--out", type=Path, default=Path("results/numa"), help="where the JSON and PNG go")
    parser.add_argument("--profile-out", type=Path, help="also write a measured profile (--profile-file) from the "
                                                         "gpu-copy-h2d and gpu-host-gemm figures here")


def run(args) -> int:

    topo = read_topology()
    kind = machine_kind(topo)
    gpu_node = (topo.gpus[args.gpu].nearest_node if topo.gpus and topo.gpus[args.gpu].nearest_node is not None
                else topo.cpu_nodes[0].id)
    chosen, skipped_places = placements(topo, gpu_node)
    reader_fns, skipped_readers = readers()
    wanted = args.readers.split(",")
    if unknown := sorted(set(wanted) - set(READERS)):
        raise UsageError(f"unknown reader(s) {', '.join(unknown)}; choose from {', '.join(READERS)}")
    reader_fns = {name: fn for name, fn in reader_fns.items() if name in wanted}
    sizes = [s * MIB for s in args.sizes_mib] if args.sizes_mib else (QUICK_SIZES if args.quick else FULL_SIZES)
    repeats = args.repeats if args.repeats is not None else (3 if args.quick else 5)
    if repeats < 1 or any(s <= 0 for s in sizes):
        raise UsageError("--repeats and --sizes-mib must be positive")

    print(f"machine: {kind}; local node {gpu_node}; nodes {list(topo.node_ids)}")
    print("will run: " + ", ".join(f"{r} x {p.name}" for r in reader_fns for p in chosen))
    for why in skipped_places + skipped_readers:
        print(f"skipped: {why}")
    if args.list:
        return 0

    results = []
    for reader_name, fn in reader_fns.items():
        for placement in chosen:
            for size in sizes:
                row = measure(placement, fn, size, repeats)
                row.update(reader=reader_name, placement=placement.name)
                results.append(row)

    print(f"\n{'reader':<18} {'placement':<12} {'size':>9} {'median GB/s':>12} {'min-max':>15}  limit")
    for r in results:
        limit = LIMITS.get((kind, r["reader"], r["placement"]))
        limit_text = f"{limit[0]:.0f} GB/s ({limit[1]})" if limit else "n/a (no published figure)"
        print(f"{r['reader']:<18} {r['placement']:<12} {r['bytes'] // MIB:>6} MiB {r['median_gbps']:>12.1f} "
              f"{r['min_gbps']:>7.1f}-{r['max_gbps']:<7.1f}  {limit_text}")

    args.out.mkdir(parents=True, exist_ok=True)
    report = {"machine": kind, "local_node": gpu_node, "nodes": list(topo.node_ids), "results": results,
              "skipped": skipped_places + skipped_readers}
    (args.out / "numa_placement.json").write_text(json.dumps(report, indent=2))  # before plotting: never lost
    print(f"\nwrote {args.out / 'numa_placement.json'}")
    if args.profile_out and not write_profile(report, args.profile_out):
        return 1
    if not args.no_plot:
        try:
            plot(results, args.out / "numa_placement.png")
            print(f"wrote {args.out / 'numa_placement.png'}")
        except ImportError as exc:
            print(f"no plot: {exc} (pip install matplotlib, or pass --no-plot); the measurements are in the JSON")
    return 0
