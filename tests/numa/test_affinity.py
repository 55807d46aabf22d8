import os
import threading

import pytest

from gh200rt.numa.affinity import bind_current_thread, bind_process, current_cpu, node_cpus
from gh200rt.numa.topology import Node, Topology, read_topology


def _spin(n=200_000):
    x = 0
    for i in range(n):
        x += i
    return x


def test_bound_thread_runs_only_on_the_node_cpus():
    cpus = sorted(os.sched_getaffinity(0))
    target = cpus[-1]
    topo = Topology(nodes=(Node(id=0, cpus=(target,), total_bytes=1, free_bytes=1),), gpus=())
    seen, errors = set(), []

    def worker():
        try:
            assert bind_current_thread(0, topo) == {target}
            for _ in range(20):
                _spin(20_000)
                seen.add(current_cpu())
        except BaseException as e:  # surfaced in the main thread
            errors.append(e)

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert not errors, errors
    assert seen == {target}
    assert os.sched_getaffinity(0) == set(cpus), "binding a thread leaves the others alone"


def test_bind_process_to_this_machines_node():
    before = os.sched_getaffinity(0)
    try:
        topo = read_topology()
        node = topo.cpu_nodes[0]
        assert bind_process(node.id, topo) == set(node.cpus) & set(range(os.cpu_count()))
    finally:
        os.sched_setaffinity(0, before)


def test_memory_only_node_cannot_host_threads():
    topo = Topology(nodes=(Node(0, (0,), 1, 1), Node(1, (), 1, 1)), gpus=())
    with pytest.raises(ValueError, match="node 1 has no CPUs.*CPU nodes: 0"):
        node_cpus(1, topo)


def test_engine_cpus_only_narrow_what_the_process_may_use():
    topo = read_topology(os.path.join(os.path.dirname(__file__), "fixtures", "x86-2socket"))
    from gh200rt.numa.affinity import engine_cpus
    assert engine_cpus(1, set(range(128)), topo) == set(range(32, 64)) | set(range(96, 128))
    assert engine_cpus(1, {0, 1, 40}, topo) == {40}
    assert engine_cpus(1, {0, 1, 2}, topo) == set()   # a taskset on the other socket: nothing to bind to


def test_bind_engine_threads_reaches_threads_already_running():
    from gh200rt.numa.affinity import bind_engine_threads
    before = os.sched_getaffinity(0)
    target = sorted(before)[-1]
    topo = Topology(nodes=(Node(id=0, cpus=(target,), total_bytes=1, free_bytes=1),), gpus=())
    started, release, seen = threading.Event(), threading.Event(), []

    def worker():
        started.set()
        release.wait()
        seen.append(os.sched_getaffinity(0))
    t = threading.Thread(target=worker)
    t.start()
    started.wait()
    try:
        assert bind_engine_threads(0, topo) == {target}
        release.set()
        t.join()
        assert seen == [{target}]
        empty = Topology(nodes=(Node(id=0, cpus=(10_000,), total_bytes=1, free_bytes=1),), gpus=())
        assert bind_engine_threads(0, empty) is None and os.sched_getaffinity(0) == {target}
    finally:
        bind_process_all(before)


def bind_process_all(cpus):
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), cpus)
        except ProcessLookupError:
            pass
