"""NUMA per tensor-parallel rank on fake sysfs topologies (tests/numa/fixtures): on the CPU of a machine with two
nodes, rank r takes the cores of node r and its host slabs are placed on node r; on a one-node machine nothing is
bound and slabs stay on node 0. No worker process is started: rank 1's shard is loaded here."""
from __future__ import annotations

from pathlib import Path

import pytest

from gh200rt.config import EngineConfig
from gh200rt.distributed.rank_numa import node_of, rank_cpus, rank_platform
from gh200rt.distributed.sharding import TensorShard
from gh200rt.loader.load import read_arch
from gh200rt.numa.topology import read_topology
from gh200rt.platform.detect import detect
from tests.distributed.tiny_tp_models import save_tp_tiny

FIXTURES = Path(__file__).parents[1] / "numa" / "fixtures"


@pytest.mark.parametrize("machine", ["x86-2socket", "gh200-2x"])
def test_each_rank_takes_the_cores_of_its_node(machine):
    topo = read_topology(FIXTURES / machine)
    allowed = {cpu for node in topo.cpu_nodes for cpu in node.cpus}
    for rank, node in enumerate(topo.cpu_nodes):
        cpus = rank_cpus(rank, 2, allowed, topo)
        assert cpus == set(node.cpus) and node_of(cpus, topo) == node.id


def test_one_node_machine_keeps_node_0_and_binds_nothing():
    topo = read_topology(FIXTURES / "vm-1node")
    config = EngineConfig.from_kwargs(tensor_parallel_size=2)
    assert rank_platform(detect("cpu"), config, 1, 2, "cpu", topology=topo).host_numa_node == 0


def test_rank_slabs_are_placed_on_its_node(tmp_path, monkeypatch):
    import gh200rt.weights.slabs as slabs
    topo = read_topology(FIXTURES / "x86-2socket")
    placed_on = []
    allocate = slabs.allocate
    monkeypatch.setattr(slabs, "allocate", lambda nbytes, node, **kw: (placed_on.append(node),
                                                                       allocate(nbytes, node=0, **kw))[1])
    path = save_tp_tiny("llama-gqa", str(tmp_path / "llama"))
    config = EngineConfig.from_kwargs(model=path, dtype="float32", num_kv_blocks=48, max_model_len=128,
                                      tensor_parallel_size=2, offload="stream")
    from gh200rt.engine.bootstrap import load_and_place
    for rank in (0, 1):
        platform = rank_platform(detect("cpu"), config, rank, 2, "cpu", topology=topo, bind=False,
                                 allowed={cpu for node in topo.cpu_nodes for cpu in node.cpus})
        assert platform.host_numa_node == rank
        placed_on.clear()
        placed = load_and_place(config, platform, shard=TensorShard(rank, 2, read_arch(path)))
        try:
            assert placed.store.tier_counts["streamed"] == 2
            assert placed_on and set(placed_on) == {rank}, (rank, placed_on)
        finally:
            placed.store.close()
