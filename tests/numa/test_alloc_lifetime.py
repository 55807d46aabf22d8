"""A registered host buffer is unregistered before its pages are unmapped, whoever drops it last.

``StrictRegistrar`` behaves like the CUDA runtime: registering a range that overlaps a live
registration fails (cudaErrorHostMemoryAlreadyRegistered), which is what happens on a GPU when
pages are unmapped while registered and Linux hands their addresses to the next mapping.
"""
import gc

import pytest

from gh200rt.numa import alloc

MIB = 1 << 20


class StrictRegistrar:
    def __init__(self, events: list):
        self.live: dict[int, int] = {}
        self.events = events

    def register(self, address: int, nbytes: int, mapped: bool) -> None:
        for start, size in self.live.items():
            if address < start + size and start < address + nbytes:
                raise RuntimeError("cudaErrorHostMemoryAlreadyRegistered")
        self.live[address] = nbytes
        self.events.append(("register", address))

    def unregister(self, address: int) -> None:
        del self.live[address]
        self.events.append(("unregister", address))


def of(events: list, address: int) -> list[str]:
    """The events of the mapping at ``address``: a collection may unmap other tests' dropped buffers meanwhile."""
    return [kind for kind, at in events if at == address]


@pytest.fixture
def events(monkeypatch):
    log: list = []
    real_unmap = alloc._unmap

    def recording_unmap(address, length):
        log.append(("unmap", address))
        real_unmap(address, length)
    monkeypatch.setattr(alloc, "_unmap", recording_unmap)
    return log


def test_free_unregisters_then_unmaps(events):
    buf = alloc.allocate(MIB, node=0)
    buf.register_cuda(registrar=StrictRegistrar(events))
    address = buf.address
    assert buf.cuda_registered
    assert buf.free() and buf.unmapped
    assert of(events, address) == ["register", "unregister", "unmap"]


def test_last_view_releases_registered_pages(events):
    buf = alloc.allocate(MIB, node=0)
    buf.register_cuda(registrar=StrictRegistrar(events))
    address = buf.address
    view = buf.tensor[10:20]
    assert buf.free() is False and not buf.unmapped
    assert of(events, address) == ["register"]  # still registered while a view can read it
    view[0] = 7
    del view
    gc.collect()
    assert buf.unmapped
    assert of(events, address) == ["register", "unregister", "unmap"]


def test_dropped_buffers_never_leave_a_registration_behind(events):
    """Buffers dropped without free() (collected) in a loop: each new mapping can be registered."""
    registrar = StrictRegistrar(events)
    for _ in range(20):
        buf = alloc.allocate(4 * MIB + 1, node=0)
        buf.register_cuda(registrar=registrar)
        _ = buf.tensor.view(-1)[:8].sum()
        del buf, _
    gc.collect()
    assert registrar.live == {}
    assert sum(1 for e in events if e[0] == "unregister") == 20


def test_registering_twice_is_refused():
    buf = alloc.allocate(MIB, node=0)
    buf.register_cuda(registrar=StrictRegistrar([]))
    with pytest.raises(RuntimeError, match="already registered"):
        buf.register_cuda(registrar=StrictRegistrar([]))
    buf.free()


def test_failed_unregister_leaks_instead_of_unmapping(events):
    class Failing(StrictRegistrar):
        def unregister(self, address):
            raise RuntimeError("cudaErrorInvalidValue")
    buf = alloc.allocate(MIB, node=0)
    buf.register_cuda(registrar=Failing(events))
    with pytest.warns(RuntimeWarning, match="leaking the .*mapping"):
        buf.free()
    assert ("unmap", buf.address) not in events


def test_huge_pages_advised_only_on_4k_page_kernels(monkeypatch):
    buf = alloc.allocate(4 * MIB, node=0)
    try:
        if alloc.PAGE_SIZE == 4096:
            assert buf.advise_hugepages()
        monkeypatch.setattr(alloc, "PAGE_SIZE", 65536)  # a 64 KiB-page kernel (common on Grace): a THP is 512 MiB
        assert buf.advise_hugepages() is False
    finally:
        buf.free()
