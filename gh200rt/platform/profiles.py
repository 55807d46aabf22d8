"""Built-in hardware profiles: published bandwidths the cost model uses when nothing was measured.

Contract: ``PROFILES[name]`` is a ``HardwareProfile`` (all bandwidths in GB/s, 1 GB = 1e9 bytes).
Figures come from the shared HARDWARE.md (hardware facts with sources) or from a recorded run on that
hardware (../shared/gpu-runs/); each entry names its sources. A measured profile (``--profile-file``,
``gh200rt/platform/bandwidth.py``) overrides these figure by figure on the host that measured it.
"""
from __future__ import annotations

from dataclasses import dataclass

GIB = 1 << 30


@dataclass(frozen=True)
class HardwareProfile:
    name: str
    kind: str                   # gh200 | x86-cuda | cuda-other | cpu
    device_memory_bytes: int
    link_h2d_gbps: float        # copy engine, pinned host -> device
    direct_read_gbps: float     # a kernel reading host memory in place
    hbm_gbps: float
    peak_tflops: float          # dense bf16 tensor-core peak
    ats: bool                   # GPU reads pageable host memory through the host page tables
    source: str | None = None   # a measured profile's account of its figures (None: all built-in)
    # host memory a plan may fill (the GPU's node on GH200); None: it depends on the host, known only on it
    host_memory_bytes: int | None = None
    # the host's cores streaming weights from the GPU's node (a cpu-tier expert's decode-time GEMV), and their
    # arithmetic over many rows (its prefill-size GEMM): where the device takes over (cost_model.cpu_expert_max_tokens)
    host_cpu_gbps: float = 10.0
    host_cpu_tflops: float = 0.5

    @property
    def figures_from(self) -> str:
        """Where the figures come from, as Plan.explain() prints it."""
        return self.source or f"the built-in {self.name} table (gh200rt/platform/profiles.py, sources beside it)"


PROFILES: dict[str, HardwareProfile] = {
    # H2D 375 GB/s (KTH, arXiv 2407.07850; dnhkng part 1 377-380); in-place ATS read 328-339 GB/s
    # from the local Grace node (dnhkng part 1); HBM3 96 GB ~4 TB/s spec, 3.4-3.7 measured (KTH);
    # 989 TFLOPS dense bf16 (NVIDIA H100/GH200 datasheet); LPDDR5X 480 GB at most (120 GB on some 4-GH200 nodes:
    # a measured profile or the host's own figure there).
    # The 72 Grace cores stream LPDDR5X at 348 GB/s (dnhkng; STREAM 486 GB/s at KTH): a GEMV is taken at the lower;
    # their float32 FMA peak is 7.1 TFLOP/s (72 cores x 4 128-bit pipes x 3.1 GHz), of which a GEMM is assumed to reach
    # 3 until measured.
    "gh200-96g": HardwareProfile("gh200-96g", "gh200", 96 * 10**9, 375.0, 330.0, 3500.0, 989.0, True,
                                 host_memory_bytes=480 * 10**9, host_cpu_gbps=348.0, host_cpu_tflops=3.0),
    # Same link figures; HBM3e 144 GB at 4.9 TB/s (dnhkng; NVIDIA GH200 material).
    "gh200-144g": HardwareProfile("gh200-144g", "gh200", 144 * 10**9, 375.0, 330.0, 4900.0, 989.0, True,
                                  host_memory_bytes=480 * 10**9, host_cpu_gbps=348.0, host_cpu_tflops=3.0),
    # Measured on an H100 SXM 80GB on an x86 host, PCIe Gen5 x16 host link (64 GB/s spec), 1 GiB buffers on
    # the GPU's NUMA node: pinned H2D 55.2 GB/s (54.2 at 64 MiB), host_gemm reading a registered slab in
    # place 51.0 GB/s (47.8 at 64 MiB) (../shared/gpu-runs/h100-2026-11-25/bandwidth.log); HBM3 80 GB at
    # 3.35 TB/s (NVIDIA datasheet).
    # The x86 hosts' cores: one socket of 8 DDR5-4800 channels (307 GB/s spec), of which a GEMV over every core is
    # assumed to stream about half, and a GEMM over its cores to reach 3 TFLOP/s (AVX-512 FMA; AMX reaches more):
    # assumptions until measured on such a host (bench bandwidth --readers cpu-linear,... --profile-out).
    "h100-sxm": HardwareProfile("h100-sxm", "x86-cuda", 80 * 10**9, 55.2, 51.0, 3350.0, 989.0, False,
                                host_cpu_gbps=150.0, host_cpu_tflops=3.0),
    # The PCIe cards below are not measured yet: PCIe Gen5 x16 ~50-55 GB/s pinned (TransformerEngine offload
    # docs); 35 GB/s direct read is nvbandwidth's SM-driven H2D (NVIDIA/nvbandwidth issue 24), below the
    # 51.0 GB/s host_gemm reached on the H100 SXM host above.
    # H100 PCIe: 80 GB HBM2e at 2.0 TB/s, 756 TFLOPS dense bf16 (NVIDIA datasheet); same PCIe Gen5 link.
    "h100-pcie": HardwareProfile("h100-pcie", "x86-cuda", 80 * 10**9, 52.0, 35.0, 2000.0, 756.0, False,
                                host_cpu_gbps=150.0, host_cpu_tflops=3.0),
    # H100 NVL (PCIe card): 94 GB HBM3 at 3.9 TB/s, 835 TFLOPS dense bf16 (1,671 with sparsity; NVIDIA
    # H100 NVL datasheet); PCIe Gen5 host link as above.
    "h100-nvl": HardwareProfile("h100-nvl", "x86-cuda", 94 * 10**9, 52.0, 35.0, 3900.0, 835.0, False,
                               host_cpu_gbps=150.0, host_cpu_tflops=3.0),
    # H200 SXM 141 GB at 4.8 TB/s (NVIDIA datasheet; a device-to-device copy measured 4.3 TB/s). Measured on one
    # on a 16-core x86 host, PCIe Gen5 x16 (docs/gpu-runs/h200-2026-11-29/bandwidth.log): pinned H2D 55.1 GB/s at
    # 1 GiB, host_gemm reading a registered slab in place 51.1 GB/s; that host's cores 94.8 GB/s (cpu-linear) and
    # 2.75 TFLOP/s (cpu-gemm). Hosts differ: measure yours (bench bandwidth --profile-out).
    "h200": HardwareProfile("h200", "x86-cuda", 141 * 10**9, 55.1, 51.1, 4800.0, 989.0, False,
                           host_cpu_gbps=94.8, host_cpu_tflops=2.75),
    # H200 NVL (PCIe card): 141 GB at 4.8 TB/s, 835 TFLOPS dense bf16 (NVIDIA H200 NVL datasheet).
    "h200-nvl": HardwareProfile("h200-nvl", "x86-cuda", 141 * 10**9, 52.0, 35.0, 4800.0, 835.0, False,
                               host_cpu_gbps=150.0, host_cpu_tflops=3.0),
    # No GPU: "device memory" is the --device-memory-budget stand-in (default 2 GiB); a copy is a
    # host memcpy (rough LPDDR/DDR figure, replaced by a measured profile when one exists).
    "cpu": HardwareProfile("cpu", "cpu", 2 * GIB, 10.0, 10.0, 20.0, 0.5, False, host_cpu_gbps=20.0,
                           host_cpu_tflops=0.5),
}


def get_profile(name: str) -> HardwareProfile:
    if name not in PROFILES:
        raise ValueError(f"unknown platform profile {name!r}: choose one of {', '.join(PROFILES)}")
    return PROFILES[name]
