import gc

import pytest
import torch

from gh200rt.numa import libnuma
from gh200rt.numa.alloc import PAGE_SIZE, allocate, where

MIB = 1 << 20


def test_bound_buffer_lives_on_its_node():
    buf = allocate(16 * MIB + 123, node=0, policy="bind")
    try:
        assert buf.nbytes == 16 * MIB + 123  # exact, never rounded up to a power of two
        pages = where(buf)
        assert pages == {0: (16 * MIB + 123 + PAGE_SIZE - 1) // PAGE_SIZE}
    finally:
        assert buf.free()


@pytest.mark.parametrize("policy", ["preferred", "interleave", "default"])
def test_other_policies_place_every_page(policy):
    buf = allocate(4 * MIB, node=0, policy=policy)
    try:
        assert sum(where(buf).values()) == 4 * MIB // PAGE_SIZE and -1 not in where(buf)
    finally:
        buf.free()


def test_tensor_and_array_share_the_memory():
    buf = allocate(1 * MIB, node=0)
    t = buf.tensor
    assert t.dtype == torch.uint8 and t.numel() == MIB
    t[5] = 42
    assert buf.array[5] == 42
    view = t[:16]
    assert buf.free() is False  # an outside view keeps the mapping alive...
    assert view[5] == 42        # ...and stays valid
    del t, view


def test_missing_node_is_a_clear_error():
    with pytest.raises(ValueError, match="NUMA node 7 does not exist on this machine; nodes: 0"):
        allocate(MIB, node=7)


@pytest.mark.parametrize("kwargs,match", [
    (dict(nbytes=0), "positive byte count"),
    (dict(nbytes=MIB, policy="sticky"), "unknown NUMA policy 'sticky'"),
])
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        allocate(**kwargs)


def test_free_returns_memory():
    psutil = pytest.importorskip("psutil")  # the test extra: a bare GPU host need not have it
    proc = psutil.Process()
    gc.collect()
    before = proc.memory_info().rss
    buf = allocate(256 * MIB, node=0)
    during = proc.memory_info().rss
    assert during - before > 200 * MIB, "the pages were touched"
    assert buf.free()
    after = proc.memory_info().rss
    assert during - after > 200 * MIB, f"RSS {before >> 20} -> {during >> 20} -> {after >> 20} MiB"
    with pytest.raises(RuntimeError, match="freed"):
        buf.array


def test_missing_libnuma(monkeypatch):
    def missing():
        raise libnuma.LibnumaMissing(f"libnuma is not installed; {libnuma.INSTALL_HINT}")
    monkeypatch.setattr(libnuma, "load", missing)
    with pytest.raises(libnuma.LibnumaMissing, match="apt-get install libnuma1"):
        allocate(MIB, node=0)
    with pytest.warns(UserWarning, match="NOT bound"):
        buf = allocate(MIB, node=0, allow_unbound=True)
    assert buf.policy == "default" and buf.array[0] == 0
    buf.free()
    assert allocate(MIB, policy="default").free()  # first touch needs no libnuma


@pytest.mark.gpu
def test_register_with_cuda_at_exact_size():
    buf = allocate(3 * MIB + 5, node=0)
    buf.register_cuda(mapped=True)
    assert buf.device_pointer() != 0
    buf.unregister_cuda()
    buf.free()
