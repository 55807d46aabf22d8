"""`python -m gh200rt.numa`: the topology as `numactl --hardware` prints it, plus each GPU's nodes."""
from __future__ import annotations

import argparse
import sys

from gh200rt.numa.topology import Topology, read_topology


def _gib(nbytes: int) -> str:
    return f"{nbytes / 2**30:.1f} GiB"


def format_topology(topo: Topology) -> str:
    ids = topo.node_ids
    lines = [f"available: {len(ids)} nodes ({', '.join(map(str, ids))})"]
    for n in topo.nodes:
        kind = "" if n.has_cpus else ("  (memory only)" if n.total_bytes else "  (empty)")
        lines.append(f"node {n.id} cpus: {' '.join(map(str, n.cpus))}{kind}")
        lines.append(f"node {n.id} size: {_gib(n.total_bytes)}")
        lines.append(f"node {n.id} free: {_gib(n.free_bytes)}")
    lines.append("node distances:")
    lines.append("node " + "".join(f"{i:>4}" for i in ids))
    for n in topo.nodes:
        lines.append(f"{n.id:>4}:" + "".join(f"{n.distances.get(j, '?'):>4}" for j in ids))
    if not topo.gpus:
        lines.append("gpus: none (no NVIDIA GPU on the PCI bus)")
    for i, g in enumerate(topo.gpus):
        near = "unknown (firmware reports -1)" if g.nearest_node is None else str(g.nearest_node)
        mem = f", memory node {g.memory_node} (GPU memory as a NUMA node)" if g.memory_node is not None else ""
        lines.append(f"gpu {i} {g.bus_id}: nearest node {near}{mem}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gh200rt.numa", description=__doc__)
    parser.add_argument("--sysfs-root", default="/sys", help="read another machine's sysfs tree (default: /sys)")
    args = parser.parse_args(argv)
    print(format_topology(read_topology(args.sysfs_root)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
