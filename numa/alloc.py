"""NUMA-bound host buffers: exact-size anonymous mappings with a memory policy, touched once.

``allocate(nbytes, node, policy)`` maps exactly ``nbytes`` (rounded only to the page size, never to
a power of two), applies the policy with ``mbind`` *before* any page is touched, then touches the
buffer in chunks so every page lands where asked. ``where(buf)`` reports pages per node.

Lifetime: ``.array`` and ``.tensor`` (and any view of them) keep the mapping alive; ``free()``
drops the buffer's own references and unmaps at once when no outside view is left, otherwise the
mapping goes away with the last view. A buffer registered with CUDA is unregistered first.

Without libnuma, ``policy="default"`` still works (first touch); any other policy raises
``LibnumaMissing`` naming the package, unless ``allow_unbound=True``, which warns and falls back
to unbound memory.
"""
from __future__ import annotations

import mmap
import warnings

import numpy as np

from gh200rt.numa import libnuma
from gh200rt.numa.topology import read_topology

PAGE_SIZE = mmap.PAGESIZE
TOUCH_CHUNK = 64 << 20
POLICIES = tuple(libnuma.POLICY_MODES)


class HostBuffer:
    def __init__(self, nbytes: int, node: int | None, policy: str, nodes: list[int], hugepages: bool):
        self.nbytes = nbytes
        self.node = node
        self.nodes = nodes
        self.policy = policy
        self.hugepages = hugepages
        self._map = mmap.mmap(-1, max(nbytes, 1), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS,
                              prot=mmap.PROT_READ | mmap.PROT_WRITE)
        self._array = np.frombuffer(self._map, dtype=np.uint8, count=nbytes)
        self.address = int(self._array.ctypes.data) if nbytes else 0
        self._tensor = None
        self._cuda_registered = False

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
        return self._map is None

    def _check_alive(self) -> None:
        if self._map is None:
            raise RuntimeError("this host buffer was freed")

    def touch(self) -> None:
        arr = self._array
        for start in range(0, self.nbytes, TOUCH_CHUNK):
            arr[start:start + TOUCH_CHUNK:PAGE_SIZE] = 0

    def register_cuda(self, mapped: bool = True) -> None:
        """Pin for DMA at exact size (cudaHostRegister); ``mapped`` also gives the GPU a device pointer."""
        self._check_alive()
        from cuda.bindings import runtime as rt
        flags = rt.cudaHostRegisterPortable | (rt.cudaHostRegisterMapped if mapped else 0)
        (err,) = rt.cudaHostRegister(self.address, self.nbytes, flags)
        if err != rt.cudaError_t.cudaSuccess:
            raise RuntimeError(f"cudaHostRegister of {self.nbytes} bytes failed: {err.name}")
        self._cuda_registered = True

    def device_pointer(self) -> int:
        """The device address of a mapped registration (x86 PCIe); on GH200 the host address works as is."""
        from cuda.bindings import runtime as rt
        err, ptr = rt.cudaHostGetDevicePointer(self.address, 0)
        if err != rt.cudaError_t.cudaSuccess:
            raise RuntimeError(f"cudaHostGetDevicePointer failed: {err.name} (register with mapped=True first)")
        return int(ptr)

    def unregister_cuda(self) -> None:
        if not self._cuda_registered:
            return
        from cuda.bindings import runtime as rt
        (err,) = rt.cudaHostUnregister(self.address)
        if err != rt.cudaError_t.cudaSuccess:
            raise RuntimeError(f"cudaHostUnregister failed: {err.name}")
        self._cuda_registered = False

    def free(self) -> bool:
        """Release the mapping; True when it was unmapped now, False when outside views still hold it."""
        if self._map is None:
            return True
        self.unregister_cuda()
        m, self._map, self._array, self._tensor = self._map, None, None, None
        try:
            m.close()
            return True
        except BufferError:
            return False

    def __repr__(self) -> str:
        state = "freed" if self.freed else f"at 0x{self.address:x}"
        return f"HostBuffer({self.nbytes} bytes, policy={self.policy}, nodes={self.nodes}, {state})"


def allocate(nbytes: int, node: int | None = 0, policy: str = "bind", hugepages: bool = False,
             nodes: list[int] | None = None, allow_unbound: bool = False, sysfs_root: str = "/sys") -> HostBuffer:
    """``nbytes`` of host memory under ``policy`` on ``node`` (or ``nodes`` for interleave), touched once."""
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
        buf._map.madvise(mmap.MADV_HUGEPAGE)
    if targets:
        try:
            libnuma.mbind(buf.address, _page_round(nbytes), policy, targets)
        except libnuma.LibnumaMissing as e:
            if not allow_unbound:
                buf.free()
                raise
            warnings.warn(f"{e}; the buffer is NOT bound to node(s) {targets} (allow_unbound=True)", stacklevel=2)
            buf.policy, buf.nodes = "default", []
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

