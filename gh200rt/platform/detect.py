"""Platform detection: one frozen description of the machine gh200rt runs on.

Contract: ``detect(profile_name=None, measured_profile=None) -> Platform`` never raises or warns on
a machine without a GPU (it returns kind ``cpu``); only a bad measured profile raises
(``ProfileFileError``). CUDA is queried once via torch. Bandwidths come from a measured profile JSON
when given (``--profile-file``, platform/bandwidth.py), else from the named built-in profile matching
the device; ``Platform.figures_from`` says which.
"""
from __future__ import annotations

import dataclasses
import platform as _pyplatform
import warnings
from dataclasses import dataclass
from pathlib import Path

from gh200rt.platform.bandwidth import load_measured_profile
from gh200rt.platform.profiles import HardwareProfile, get_profile


@dataclass(frozen=True)
class Platform:
    kind: str
    device_name: str
    device_memory_bytes: int
    host_numa_node: int
    ats: bool
    link_h2d_gbps: float
    direct_read_gbps: float
    hbm_gbps: float
    peak_tflops: float
    profile: str
    figures_from: str = "a built-in table (gh200rt/platform/profiles.py)"
    host_memory_bytes: int | None = None   # a named profile's host memory (None: the host's own, where known)
    host_cpu_gbps: float = 10.0            # the host's cores reading weights (a cpu-tier expert)
    host_cpu_tflops: float = 0.5           # and computing over many rows

    @classmethod
    def from_profile(cls, prof: HardwareProfile, device_name: str | None = None,
                     device_memory_bytes: int | None = None, host_numa_node: int = 0,
                     ats: bool | None = None) -> "Platform":
        return cls(kind=prof.kind, device_name=device_name or prof.name,
                   device_memory_bytes=device_memory_bytes or prof.device_memory_bytes,
                   host_numa_node=host_numa_node, ats=prof.ats if ats is None else ats,
                   link_h2d_gbps=prof.link_h2d_gbps, direct_read_gbps=prof.direct_read_gbps,
                   hbm_gbps=prof.hbm_gbps, peak_tflops=prof.peak_tflops, profile=prof.name,
                   figures_from=prof.figures_from, host_memory_bytes=prof.host_memory_bytes,
                   host_cpu_gbps=prof.host_cpu_gbps, host_cpu_tflops=prof.host_cpu_tflops)


def profile_for_device(name: str, total_bytes: int, aarch64: bool) -> str:
    """The built-in profile for a CUDA device name ("NVIDIA H100 80GB HBM3", "NVIDIA H100 NVL", ...)."""
    lowered = name.lower()
    if "gh200" in lowered or (aarch64 and "h100" in lowered):
        return "gh200-144g" if total_bytes > 110 * 10**9 else "gh200-96g"
    if "h200" in lowered:
        return "h200-nvl" if "nvl" in lowered else "h200"
    if "h100" in lowered:
        if "nvl" in lowered:
            return "h100-nvl"
        return "h100-pcie" if "pcie" in lowered else "h100-sxm"
    return "h100-pcie"  # conservative PCIe figures for an unknown CUDA device


def pci_address(domain: int, bus: int, device: int) -> str:
    """The sysfs name of a PCI function 0 from CUDA's integer ids: (0, 0xca, 0) -> '0000:ca:00.0'."""
    return f"{domain:04x}:{bus:02x}:{device:02x}.0"


def gpu_numa_node(bus_id: str, sysfs_root: str | Path = "/sys") -> int:
    """The host NUMA node nearest the GPU at ``bus_id`` (its slabs and copy threads belong there).

    When the firmware does not say (numa_node -1, common in VMs) the machine's first CPU node is the
    answer on a one-socket machine; on several sockets it is a guess, and the warning says how to check.
    """
    from gh200rt.numa.topology import read_topology
    topology = read_topology(sysfs_root)
    try:
        nearest = topology.nearest_node_for_gpu(bus_id)
    except ValueError:
        nearest = None
    if nearest is not None:
        return nearest
    first = topology.cpu_nodes[0].id if topology.cpu_nodes else 0
    if len(topology.cpu_nodes) > 1:
        warnings.warn(f"the kernel does not report the NUMA node of the GPU at {bus_id}; placing host weights on "
                      f"node {first}. Check with `python -m gh200rt.numa` and `nvidia-smi topo -m`", stacklevel=2)
    return first


def _cuda_pci_address(device_index: int) -> str:
    import torch
    props = torch.cuda.get_device_properties(device_index)
    return pci_address(props.pci_domain_id, props.pci_bus_id, props.pci_device_id)


def _ats_supported(device_index: int) -> bool:
    try:
        from cuda.bindings import runtime as cudart  # type: ignore[import-not-found]
        attr = cudart.cudaDeviceAttr.cudaDevAttrPageableMemoryAccessUsesHostPageTables
        err, value = cudart.cudaDeviceGetAttribute(attr, device_index)
        return bool(value) if int(err) == 0 else False
    except Exception:
        return False


def detect(profile_name: str | None = None, measured_profile: str | Path | None = None,
           device_index: int = 0) -> Platform:
    """``device_index``: the GPU whose properties and nearest NUMA node are read (a tensor-parallel rank's)."""
    if profile_name is not None:
        prof = get_profile(profile_name)
        if measured_profile:
            prof = load_measured_profile(measured_profile, prof)
        return Platform.from_profile(prof)
    import torch
    if not torch.cuda.is_available():
        prof = get_profile("cpu")
        if measured_profile:
            prof = load_measured_profile(measured_profile, prof)
        return Platform.from_profile(prof, device_name=_pyplatform.processor() or "cpu")
    props = torch.cuda.get_device_properties(device_index)
    aarch64 = _pyplatform.machine() in ("aarch64", "arm64")
    ats = _ats_supported(device_index)
    prof = get_profile(profile_for_device(props.name, props.total_memory, aarch64 and ats))
    if measured_profile:
        prof = load_measured_profile(measured_profile, prof)
    kind = "gh200" if (aarch64 and ats) else ("x86-cuda" if prof.kind == "x86-cuda" and
                                                 ("H100" in props.name or "H200" in props.name)
                                                 else "cuda-other")
    # every figure of the profile (the host's cores included: a cpu-tier expert's limit is computed from them),
    # the device's own name, memory and nearest node; host memory is the host's own, not a named profile's
    platform = Platform.from_profile(prof, device_name=props.name, device_memory_bytes=props.total_memory,
                                     host_numa_node=gpu_numa_node(_cuda_pci_address(device_index)), ats=ats)
    return dataclasses.replace(platform, kind=kind, host_memory_bytes=None)
