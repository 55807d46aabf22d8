"""Writes the sysfs fixture trees under fixtures/ (run once; the trees are committed).

    python tests/numa/make_fixtures.py
"""
from pathlib import Path

HERE = Path(__file__).parent / "fixtures"
GIB_KB = 1024 * 1024

MACHINES = {
    # one-node VM, a virtio device only
    "vm-1node": dict(nodes={0: ("0-3", 16 * GIB_KB, 12 * GIB_KB)}, distances=[[10]],
                     pci={"0000:00:02.0": ("0x1af4", "0x010000", 0)}),
    # two-socket x86 host, an H100 on each socket, and a non-GPU NVIDIA-adjacent NIC
    "x86-2socket": dict(nodes={0: ("0-31,64-95", 512 * GIB_KB, 400 * GIB_KB), 1: ("32-63,96-127", 512 * GIB_KB, 450 * GIB_KB)},
                        distances=[[10, 21], [21, 10]],
                        pci={"0000:17:00.0": ("0x10de", "0x030200", 0), "0000:ca:00.0": ("0x10de", "0x030200", 1),
                             "0000:31:00.0": ("0x15b3", "0x020000", 0), "0000:00:00.0": ("0x8086", "0x060000", -1)}),
    # GH200: node 0 Grace CPUs + LPDDR5X, node 1 the HBM (no CPUs), nodes 2-8 empty (MIG)
    "gh200": dict(nodes={0: ("0-71", 480 * GIB_KB, 470 * GIB_KB), 1: ("", 96 * GIB_KB, 95 * GIB_KB),
                         **{i: ("", 0, 0) for i in range(2, 9)}},
                  distances=[[10, 80] + [80] * 7, [80, 10] + [80] * 7] + [[80] * 9 for _ in range(7)],
                  pci={"0009:01:00.0": ("0x10de", "0x030200", 0), "0000:00:00.0": ("0x10de", "0x060400", 0)}),
    # two GH200 superchips on one board: CPU nodes 0 and 1; GPU0's HBM node 2, GPU1's HBM node 10
    "gh200-2x": dict(nodes={0: ("0-71", 480 * GIB_KB, 460 * GIB_KB), 1: ("72-143", 480 * GIB_KB, 470 * GIB_KB),
                            2: ("", 96 * GIB_KB, 95 * GIB_KB), **{i: ("", 0, 0) for i in range(3, 10)},
                            10: ("", 96 * GIB_KB, 96 * GIB_KB), **{i: ("", 0, 0) for i in range(11, 18)}},
                     distances=None,
                     pci={"0009:01:00.0": ("0x10de", "0x030200", 0), "0019:01:00.0": ("0x10de", "0x030200", 1)}),
}


def _gh200_2x_distance(a: int, b: int) -> int:
    socket = lambda n: 0 if n in (0, *range(2, 10)) else 1  # noqa: E731
    if a == b:
        return 10
    if a in (0, 1) and b in (0, 1):
        return 40
    return 80 if socket(a) == socket(b) else 160


def write(name: str, spec: dict) -> None:
    root = HERE / name
    ids = sorted(spec["nodes"])
    node_dir = root / "devices/system/node"
    node_dir.mkdir(parents=True, exist_ok=True)
    (node_dir / "online").write_text(f"0-{ids[-1]}\n")
    for row, i in enumerate(ids):
        cpus, total, free = spec["nodes"][i]
        d = node_dir / f"node{i}"
        d.mkdir(exist_ok=True)
        (d / "cpulist").write_text(cpus + "\n")
        (d / "meminfo").write_text(f"Node {i} MemTotal:       {total} kB\nNode {i} MemFree:        {free} kB\n"
                                   f"Node {i} MemUsed:        {total - free} kB\n")
        dist = spec["distances"][row] if spec["distances"] else [_gh200_2x_distance(i, j) for j in ids]
        (d / "distance").write_text(" ".join(map(str, dist)) + "\n")
    for bus, (vendor, klass, node) in spec["pci"].items():
        d = root / "bus/pci/devices" / bus
        d.mkdir(parents=True, exist_ok=True)
        (d / "vendor").write_text(vendor + "\n")
        (d / "class").write_text(klass + "\n")
        (d / "numa_node").write_text(f"{node}\n")


if __name__ == "__main__":
    for name, spec in MACHINES.items():
        write(name, spec)
