"""Bind the calling thread, or every thread of this process, to the CPUs of a NUMA node.

On a GPU platform the engine binds its threads (``bind_engine_threads``, ``--bind-threads``) to the
GPU's nearest node, so the memory they first touch and the copies they drive stay on that node;
threads started later (the copy worker) inherit the binding. It only ever narrows the CPUs the
process was given (taskset, cgroups), never widens them. Linux ``sched_setaffinity(0, ...)`` acts on
the calling thread only; binding the process walks ``/proc/self/task``.
"""
from __future__ import annotations

import os

from gh200rt.numa.topology import Topology, read_topology


def node_cpus(node: int, topology: Topology | None = None) -> set[int]:
    topo = topology or read_topology()
    cpus = set(topo.node(node).cpus)
    if not cpus:
        raise ValueError(f"NUMA node {node} has no CPUs (a memory-only node, e.g. GPU memory on GH200); "
                         f"bind to one of the CPU nodes: {', '.join(str(n.id) for n in topo.cpu_nodes)}")
    return cpus


def bind_current_thread(node: int, topology: Topology | None = None) -> set[int]:
    """Restrict the calling thread to ``node``'s CPUs; returns the CPU set now in force."""
    cpus = node_cpus(node, topology)
    os.sched_setaffinity(0, cpus)
    return os.sched_getaffinity(0)


def bind_process(node: int, topology: Topology | None = None) -> set[int]:
    """Restrict every existing thread of this process (new threads inherit from their creator)."""
    cpus = node_cpus(node, topology)
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), cpus)
        except ProcessLookupError:  # the thread ended meanwhile
            pass
    return os.sched_getaffinity(0)


def engine_cpus(node: int, allowed: set[int], topology: Topology | None = None) -> set[int]:
    """The CPUs the engine should run on: ``node``'s CPUs among those the process may use (may be empty)."""
    topo = topology or read_topology()
    return set(topo.node(node).cpus) & allowed


def bind_engine_threads(node: int, topology: Topology | None = None) -> set[int] | None:
    """Bind every thread of the process to ``node``'s allowed CPUs; None (nothing changed) when the node
    has no CPU the process may use, e.g. under a taskset on the other socket."""
    cpus = engine_cpus(node, os.sched_getaffinity(0), topology)
    if not cpus:
        return None
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), cpus)
        except ProcessLookupError:
            pass
    return os.sched_getaffinity(0)


def current_cpu() -> int:
    """The CPU the calling thread last ran on (field 39 of /proc/thread-self/stat)."""
    with open("/proc/thread-self/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[36])
