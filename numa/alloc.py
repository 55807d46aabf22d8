"""NUMA-bound host buffers: exact-size anonymous mappings with a memory policy, touched once.

``allocate(nbytes, node, policy)`` maps exactly ``nbytes`` (rounded only to the page size, never to
a power of two), applies the policy with ``mbind`` *before* any page is touched, then touches the
buffer in chunks so every page lands where asked. ``where(buf)`` reports pages per node.

Lifetime: one ``Mapping`` owns the pages. ``.array`` and ``.tensor`` (and any view of them) keep it
alive; when the last of them is gone it is released exactly once, and a mapping registered with
CUDA is unregistered *before* it is unmapped. Unmapping registered pages would leave the
registration behind: Linux hands the same addresses to the next mapping, whose ``cudaHostRegister``
then fails with cudaErrorHostMemoryAlreadyRegistered. ``free()`` drops the buffer's own references
and releases at once when no outside view is left. A registration that cannot be undone leaks the
mapping (with a warning) rather than let its addresses be reused.

Without libnuma, ``policy="default"`` still works (first touch); any other policy raises
``LibnumaMissing`` naming the package, unless ``allow_unbound=True``, which warns and falls back
to unbound memory.
"""
from __future__ import annotations

import ctypes
import mmap
import os
import warnings
import weakref

import numpy as np

from gh200rt.numa import libnuma
from gh200rt.numa.topology import read_topology

PAGE_SIZE = mmap.PAGESIZE
TOUCH_CHUNK = 64 << 20
POLICIES = tuple(libnuma.POLICY_MODES)
# Transparent huge pages help a GEMV that streams a slab of 4 KiB pages (TLB reach). On a 64 KiB-page
# kernel (common on Grace) a THP is 512 MiB: the TLB already reaches far, and advising would round
# slabs up to 512 MiB chunks of physical memory, so huge pages are only advised on 4 KiB-page kernels.
HUGEPAGE_ADVICE_PAGE_SIZE = 4096

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.mmap.restype = ctypes.c_void_p
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.munmap.restype = ctypes.c_int
_libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_libc.madvise.restype = ctypes.c_int
_MAP_FAILED = ctypes.c_void_p(-1).value


def _os_error(call: str) -> OSError:
    err = ctypes.get_errno()
    return OSError(err, f"{call} failed: {os.strerror(err)}")


def _map_anonymous(length: int) -> int:
    address = _libc.mmap(None, length, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
    if address in (None, _MAP_FAILED):
        raise _os_error(f"mmap of {length} bytes")
    return address


def _unmap(address: int, length: int) -> None:
    if _libc.munmap(address, length) != 0:
        raise _os_error(f"munmap of {length} bytes at 0x{address:x}")


class CudaRegistrar:
    """Page-locks host ranges for DMA through the CUDA runtime (``cudaHostRegister``)."""

    def register(self, address: int, nbytes: int, mapped: bool) -> None:
        from cuda.bindings import runtime as rt
        flags = rt.cudaHostRegisterPortable | (rt.cudaHostRegisterMapped if mapped else 0)
        (err,) = rt.cudaHostRegister(address, nbytes, flags)
        if err != rt.cudaError_t.cudaSuccess:
            raise RuntimeError(f"cudaHostRegister of {nbytes} bytes at 0x{address:x} failed: {err.name}")

    def unregister(self, address: int) -> None:
        from cuda.bindings import runtime as rt
        (err,) = rt.cudaHostUnregister(address)
        if err != rt.cudaError_t.cudaSuccess:
            raise RuntimeError(f"cudaHostUnregister of 0x{address:x} failed: {err.name}")


class _Pages:
    """What must happen to one mapping's pages when it goes: unregister (if registered), then unmap."""

    def __init__(self, address: int, length: int):
        self.address, self.length = address, length
        self.registrar: CudaRegistrar | None = None

    def release(self) -> None:
        if self.registrar is not None:
            try:
                self.registrar.unregister(self.address)
            except Exception as exc:  # noqa: BLE001 - a finalizer must not raise; leaking is the safe outcome
                warnings.warn(f"{exc}; leaking the {self.length}-byte mapping at 0x{self.address:x} so its "
                              f"addresses are not reused while registered", RuntimeWarning, stacklevel=1)
                return
            self.registrar = None
        _unmap(self.address, self.length)


class Mapping:
    """The single owner of an anonymous mapping; numpy arrays built over it keep it alive (``base``)."""

    def __init__(self, nbytes: int):
        self.nbytes = nbytes
        length = _page_round(max(nbytes, 1))
        self.pages = _Pages(_map_anonymous(length), length)
        self.released = weakref.finalize(self, self.pages.release)
        self.__array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (self.pages.address, False),
                                    "version": 3}

    @property
    def address(self) -> int:
        return self.pages.address


class HostBuffer:
    def __init__(self, nbytes: int, node: int | None, policy: str, nodes: list[int], hugepages: bool):
        self.nbytes = nbytes
        self.node = node
        self.nodes = nodes
        self.policy = policy
        self.hugepages = hugepages
        self._mapping: Mapping | None = Mapping(nbytes)
        self._finalizer = self._mapping.released
        self._array = np.asarray(self._mapping)
        self.address = self._mapping.address
        self._tensor = None

    @property
    def array(self) -> np.ndarray:
        self._check_alive()
        return self._array

    @property
    def tensor(self):
        """A torch uint8 tensor over the same memory (torch is imported only when asked)."""
        self._check_alive()
        if self._tensor is None:
            import torch
            self._tensor = torch.from_numpy(self._array)
        return self._tensor

    @property
    def freed(self) -> bool:
        """True once this buffer gave up its memory (``free()``); the pages may outlive it in views."""
        return self._mapping is None

    @property
    def unmapped(self) -> bool:
        """True once the pages themselves are gone (no buffer or view holds them any more)."""
        return not self._finalizer.alive

    @property
    def cuda_registered(self) -> bool:
        return self._mapping is not None and self._mapping.pages.registrar is not None

    def _check_alive(self) -> None:
        if self._mapping is None:
            raise RuntimeError("this host buffer was freed")

    def touch(self) -> None:
        arr = self._array
        for start in range(0, self.nbytes, TOUCH_CHUNK):
            arr[start:start + TOUCH_CHUNK:PAGE_SIZE] = 0

    def advise_hugepages(self) -> bool:
        """Ask for transparent huge pages where they help (4 KiB base pages); True when advised."""
        if PAGE_SIZE != HUGEPAGE_ADVICE_PAGE_SIZE or not hasattr(mmap, "MADV_HUGEPAGE"):
            return False
        pages = self._mapping.pages
        return _libc.madvise(pages.address, pages.length, mmap.MADV_HUGEPAGE) == 0

    def register_cuda(self, mapped: bool = True, registrar: CudaRegistrar | None = None) -> None:
        """Pin for DMA at exact size (cudaHostRegister); ``mapped`` also gives the GPU a device pointer.
        The registration is undone before the pages are unmapped, whoever drops them last."""
        self._check_alive()
        pages = self._mapping.pages
        if pages.registrar is not None:
            raise RuntimeError(f"{self!r} is already registered")
        registrar = registrar or CudaRegistrar()
        registrar.register(self.address, self.nbytes, mapped)
        pages.registrar = registrar

    def device_pointer(self) -> int:
        """The device address of a mapped registration (x86 PCIe); on GH200 the host address works as is."""
        from cuda.bindings import runtime as rt
        err, ptr = rt.cudaHostGetDevicePointer(self.address, 0)
        if err != rt.cudaError_t.cudaSuccess:
            raise RuntimeError(f"cudaHostGetDevicePointer failed: {err.name} (register with mapped=True first)")
        return int(ptr)

    def unregister_cuda(self) -> None:
        self._check_alive()
        pages = self._mapping.pages
        if pages.registrar is not None:
            pages.registrar.unregister(self.address)
            pages.registrar = None

    def free(self) -> bool:
        """Give up the buffer's memory; True when the pages were released now, False when outside views
        still hold them (they are released, unregistered first, with the last view)."""
        self._mapping = self._array = self._tensor = None
        return self.unmapped

    def __repr__(self) -> str:
        state = "freed" if self.freed else f"at 0x{self.address:x}"
        return f"HostBuffer({self.nbytes} bytes, policy={self.policy}, nodes={self.nodes}, {state})"


def allocate(nbytes: int, node: int | None = 0, policy: str = "bind", hugepages: bool = False,
             nodes: list[int] | None = None, allow_unbound: bool = False, sysfs_root: str = "/sys",
             touch: bool = True) -> HostBuffer:
    """``nbytes`` of host memory under ``policy`` on ``node`` (or ``nodes`` for interleave), touched once
    (``touch=False``: left for the caller's first write, which the policy places just the same)."""
    if not isinstance(nbytes, int) or nbytes <= 0:
        raise ValueError(f"allocate needs a positive byte count, got {nbytes!r}")
    if policy not in POLICIES:
        raise ValueError(f"unknown NUMA policy {policy!r}; choose one of {', '.join(POLICIES)}")
    topo = read_topology(sysfs_root)
    if policy == "default":
        targets: list[int] = []
    elif nodes is not None:
        targets = list(nodes)
    elif policy == "interleave" and node is None:
        targets = [n.id for n in topo.nodes if n.total_bytes > 0] or list(topo.node_ids)
    else:
        if node is None:
            raise ValueError(f"policy {policy!r} needs a node")
        targets = [node]
    for t in targets:
        topo.node(t)  # raises ValueError naming the nodes that exist

    buf = HostBuffer(nbytes, node if policy != "default" else None, policy, targets, hugepages)
    if hugepages:
        buf.advise_hugepages()
    if targets:
        try:
            libnuma.mbind(buf.address, _page_round(nbytes), policy, targets)
        except libnuma.LibnumaMissing as e:
            if not allow_unbound:
                buf.free()
                raise
            warnings.warn(f"{e}; the buffer is NOT bound to node(s) {targets} (allow_unbound=True)", stacklevel=2)
            buf.policy, buf.nodes = "default", []
    if touch:
        buf.touch()
    return buf


def _page_round(nbytes: int) -> int:
    return (nbytes + PAGE_SIZE - 1) // PAGE_SIZE * PAGE_SIZE


def where(buf: HostBuffer) -> dict[int, int]:
    """Pages of ``buf`` per NUMA node (move_pages in query mode); key -1 counts pages not resident."""
    buf._check_alive()
    counts: dict[int, int] = {}
    for status in libnuma.page_nodes(buf.address, buf.nbytes, PAGE_SIZE):
        key = status if status >= 0 else -1
        counts[key] = counts.get(key, 0) + 1
    return counts

