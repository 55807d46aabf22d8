from pathlib import Path

import pytest

from gh200rt.numa.__main__ import format_topology, main
from gh200rt.numa.topology import parse_cpulist, read_topology

FIXTURES = Path(__file__).parent / "fixtures"
GIB = 1024**3


def test_cpulist():
    assert parse_cpulist("0-3,8,10-11\n") == (0, 1, 2, 3, 8, 10, 11)
    assert parse_cpulist("\n") == ()


def test_one_node_vm():
    topo = read_topology(FIXTURES / "vm-1node")
    assert topo.node_ids == (0,)
    assert topo.node(0).cpus == (0, 1, 2, 3) and topo.node(0).total_bytes == 16 * GIB
    assert topo.gpus == () and topo.memory_only_nodes == ()
    with pytest.raises(ValueError, match="NUMA node 3 does not exist.*nodes: 0"):
        topo.node(3)


def test_two_socket_x86_gpu_on_each_socket():
    topo = read_topology(FIXTURES / "x86-2socket")
    assert [n.id for n in topo.cpu_nodes] == [0, 1]
    assert topo.node(1).distances == {0: 21, 1: 10}
    assert [g.bus_id for g in topo.gpus] == ["0000:17:00.0", "0000:ca:00.0"]  # the NIC and bridge are not GPUs
    assert topo.nearest_node_for_gpu(0) == 0 and topo.nearest_node_for_gpu(1) == 1
    assert topo.nearest_node_for_gpu("00000000:CA:00.0") == 1  # CUDA's spelling of the bus id
    assert all(g.memory_node is None for g in topo.gpus)  # PCIe GPUs expose no memory node


def test_gh200_hbm_node_and_mig_nodes():
    topo = read_topology(FIXTURES / "gh200")
    assert topo.node(0).has_cpus and len(topo.node(0).cpus) == 72
    assert [n.id for n in topo.memory_only_nodes] == [1]
    assert all(not topo.node(i).has_cpus and topo.node(i).total_bytes == 0 for i in range(2, 9))
    (gpu,) = topo.gpus
    assert gpu.nearest_node == 0 and gpu.memory_node == 1


def test_two_gh200_board():
    topo = read_topology(FIXTURES / "gh200-2x")
    assert [n.id for n in topo.cpu_nodes] == [0, 1]
    assert [n.id for n in topo.memory_only_nodes] == [2, 10]
    g0, g1 = topo.gpus
    assert (g0.nearest_node, g0.memory_node) == (0, 2)
    assert (g1.nearest_node, g1.memory_node) == (1, 10)
    with pytest.raises(ValueError, match="GPU 2 not found"):
        topo.gpu(2)


def test_cli_prints_like_numactl(capsys):
    assert main(["--sysfs-root", str(FIXTURES / "gh200")]) == 0
    out = capsys.readouterr().out
    assert out.startswith("available: 9 nodes (0, 1, 2, 3, 4, 5, 6, 7, 8)")
    assert "node 1 cpus:   (memory only)" in out and "node 0 size: 480.0 GiB" in out
    assert "gpu 0 0009:01:00.0: nearest node 0, memory node 1" in out


def test_this_machine_reads():
    topo = read_topology()
    assert topo.nodes and topo.cpu_nodes
    assert "available:" in format_topology(topo)
