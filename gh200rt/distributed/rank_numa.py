"""Where a tensor-parallel rank's host memory and threads go.

On GPUs, local rank r drives GPU r: its platform is detected for that GPU, so its host slabs go to that GPU's
nearest NUMA node (on a GH200 NVL2, its own superchip's LPDDR5X) and ``load_and_place`` binds its threads there
(``--bind-threads``). On the CPU the ranks split the cores this process may use: rank r takes the r-th of N equal
groups, taken in node order, and where the machine has several NUMA nodes it is bound to its group and its slabs
go to the node that holds most of it. On a one-node machine nothing is bound (each rank only takes 1/N of the
threads) and every slab goes to node 0.
"""
from __future__ import annotations

import dataclasses
import os

from gh200rt.numa.topology import Topology, read_topology
from gh200rt.platform.detect import Platform, detect


def rank_cpus(local_rank: int, local_world_size: int, allowed: set[int], topology: Topology) -> set[int]:
    """Rank ``local_rank``'s share of ``allowed``: the CPUs in node order, cut in ``local_world_size`` equal groups
    (a CPU no node lists goes last); the remainder of an uneven split is left to nobody."""
    listed = [cpu for node in topology.cpu_nodes for cpu in node.cpus if cpu in allowed]
    ordered = listed + sorted(allowed - set(listed))
    per = max(1, len(ordered) // local_world_size)
    return set(ordered[local_rank * per:(local_rank + 1) * per])


def node_of(cpus: set[int], topology: Topology) -> int:
    """The node holding most of ``cpus`` (the lowest id on a tie)."""
    return max(topology.cpu_nodes, key=lambda node: (len(cpus & set(node.cpus)), -node.id)).id


def rank_platform(platform: Platform | None, config, local_rank: int, local_world_size: int, device: str,
                  topology: Topology | None = None, allowed: set[int] | None = None, bind: bool = True) -> Platform:
    """This rank's platform (``platform``: one given by profile, else detected for the rank's device) with its host
    node; on the CPU of a machine with several nodes the calling thread is bound to the rank's cores when ``bind``
    (threads it starts later, torch's among them, inherit the binding). ``allowed``: the CPUs to split (default:
    those this process may use)."""
    memory = config.memory
    if platform is None:
        platform = detect(memory.platform, memory.profile_file, device_index=local_rank if device == "cuda" else 0)
    if device == "cuda":
        return platform
    topology = topology or read_topology()
    if len(topology.cpu_nodes) < 2:
        return platform
    cpus = rank_cpus(local_rank, local_world_size, allowed or set(os.sched_getaffinity(0)), topology)
    if bind and cpus:
        os.sched_setaffinity(0, cpus)
    return dataclasses.replace(platform, host_numa_node=node_of(cpus, topology))
