"""Host NUMA topology read from sysfs: nodes, CPUs, memory, distances, GPUs and their nodes.

The sysfs root is a parameter so tests run over fixture trees of other machines. On GH200 the
GPU's HBM appears as a CPU-less NUMA node (more empty ones exist for MIG slices); a GPU's
*memory node* is the CPU-less node with memory that is closest to the GPU's nearest CPU node and
not already claimed by a GPU earlier in PCI bus order.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

NVIDIA_VENDOR = "0x10de"
_GPU_CLASSES = ("0x0300", "0x0302")  # VGA controller, 3D controller


def parse_cpulist(text: str) -> tuple[int, ...]:
    """'0-3,8,10-11' -> (0, 1, 2, 3, 8, 10, 11); '' -> ()."""
    cpus: list[int] = []
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        cpus.extend(range(int(lo), int(hi or lo) + 1))
    return tuple(cpus)


@dataclass(frozen=True)
class Node:
    id: int
    cpus: tuple[int, ...]
    total_bytes: int
    free_bytes: int
    distances: dict[int, int] = field(default_factory=dict, compare=False)

    @property
    def has_cpus(self) -> bool:
        return bool(self.cpus)

    @property
    def memory_only(self) -> bool:
        return not self.cpus and self.total_bytes > 0


@dataclass(frozen=True)
class Gpu:
    bus_id: str                  # PCI address, e.g. 0009:01:00.0
    nearest_node: int | None     # the CPU node the device hangs off (None: firmware did not say)
    memory_node: int | None      # GH200: the NUMA node that is this GPU's own HBM


@dataclass(frozen=True)
class Topology:
    nodes: tuple[Node, ...]
    gpus: tuple[Gpu, ...]

    def node(self, node_id: int) -> Node:
        for n in self.nodes:
            if n.id == node_id:
                return n
        raise ValueError(f"NUMA node {node_id} does not exist on this machine; nodes: "
                         f"{', '.join(str(n.id) for n in self.nodes)} (see `python -m gh200rt.numa`)")

    @property
    def node_ids(self) -> tuple[int, ...]:
        return tuple(n.id for n in self.nodes)

    @property
    def cpu_nodes(self) -> tuple[Node, ...]:
        return tuple(n for n in self.nodes if n.has_cpus)

    @property
    def memory_only_nodes(self) -> tuple[Node, ...]:
        return tuple(n for n in self.nodes if n.memory_only)

    def gpu(self, index_or_bus_id: int | str) -> Gpu:
        if isinstance(index_or_bus_id, int):
            if not 0 <= index_or_bus_id < len(self.gpus):
                raise ValueError(f"GPU {index_or_bus_id} not found; this machine has {len(self.gpus)} NVIDIA GPU(s)")
            return self.gpus[index_or_bus_id]
        wanted = _normalise_bus_id(index_or_bus_id)
        for g in self.gpus:
            if g.bus_id == wanted:
                return g
        raise ValueError(f"no NVIDIA GPU at PCI address {index_or_bus_id}; found: "
                         f"{', '.join(g.bus_id for g in self.gpus) or 'none'}")

    def nearest_node_for_gpu(self, index_or_bus_id: int | str) -> int | None:
        return self.gpu(index_or_bus_id).nearest_node


def _normalise_bus_id(bus_id: str) -> str:
    """CUDA reports '00000009:01:00.0'; sysfs names the device '0009:01:00.0'."""
    bus_id = bus_id.strip().lower()
    domain, _, rest = bus_id.partition(":")
    return f"{int(domain, 16):04x}:{rest}" if rest else bus_id


def _read(path: Path, default: str = "") -> str:
    try:
        return path.read_text()
    except OSError:
        return default


def _meminfo_bytes(text: str, key: str) -> int:
    m = re.search(rf"{key}:\s+(\d+)\s*kB", text)
    return int(m.group(1)) * 1024 if m else 0


def _read_nodes(root: Path) -> list[Node]:
    base = root / "devices/system/node"
    ids = sorted(int(p.name[4:]) for p in base.glob("node[0-9]*"))
    nodes = []
    for i in ids:
        d = base / f"node{i}"
        meminfo = _read(d / "meminfo")
        dist = [int(x) for x in _read(d / "distance").split()]
        nodes.append(Node(id=i, cpus=parse_cpulist(_read(d / "cpulist")),
                          total_bytes=_meminfo_bytes(meminfo, "MemTotal"),
                          free_bytes=_meminfo_bytes(meminfo, "MemFree"),
                          distances=dict(zip(ids, dist)) if len(dist) == len(ids) else {}))
    return nodes


def _read_gpus(root: Path, nodes: list[Node]) -> list[Gpu]:
    found = []
    for dev in sorted((root / "bus/pci/devices").glob("*")):
        if _read(dev / "vendor").strip() != NVIDIA_VENDOR:
            continue
        if not _read(dev / "class").strip().startswith(_GPU_CLASSES):
            continue
        raw = _read(dev / "numa_node", "-1").strip()
        node = int(raw) if raw.lstrip("-").isdigit() and int(raw) >= 0 else None
        found.append((_normalise_bus_id(dev.name), node))

    by_id = {n.id: n for n in nodes}
    claimed: set[int] = set()
    gpus = []
    for bus_id, near in found:
        memory_node = None
        if near is not None and near in by_id:
            candidates = [n for n in nodes if n.memory_only and n.id not in claimed]
            candidates.sort(key=lambda n: (by_id[near].distances.get(n.id, 1 << 30), n.id))
            if candidates:
                memory_node = candidates[0].id
                claimed.add(memory_node)
        gpus.append(Gpu(bus_id=bus_id, nearest_node=near, memory_node=memory_node))
    return gpus


def read_topology(sysfs_root: str | Path = "/sys") -> Topology:
    """Read the topology under ``sysfs_root``; a machine without NUMA sysfs is one node with all CPUs."""
    root = Path(sysfs_root)
    nodes = _read_nodes(root)
    if not nodes:
        import os
        nodes = [Node(id=0, cpus=tuple(sorted(os.sched_getaffinity(0))), total_bytes=0, free_bytes=0,
                      distances={0: 10})]
    return Topology(nodes=tuple(nodes), gpus=tuple(_read_gpus(root, nodes)))
