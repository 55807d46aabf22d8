"""Host slabs: one exact-size contiguous host buffer per offloaded layer.

Contract: ``allocate_slab(nbytes, node)`` returns an object with the ``gh200rt.numa.alloc.HostBuffer``
interface (``.tensor`` uint8 [nbytes], ``.nbytes``, ``.node``, ``.free()``). It uses
``gh200rt.numa.alloc.allocate`` when that module exists; until it lands, a plain torch allocation
stands in (``.node`` is then the requested node, NOT verified placement).
"""
from __future__ import annotations

import torch


class PlainHostBuffer:
    """Stand-in for numa.alloc.HostBuffer: ordinary host memory, no NUMA binding."""

    def __init__(self, nbytes: int, node: int):
        self.tensor = torch.empty(nbytes, dtype=torch.uint8)
        self.nbytes = nbytes
        self.node = node

    @property
    def array(self):
        return self.tensor.numpy()

    def free(self) -> None:
        self.tensor = torch.empty(0, dtype=torch.uint8)


def allocate_slab(nbytes: int, node: int = 0):
    if nbytes <= 0:
        raise ValueError(f"slab size must be positive, got {nbytes}")
    try:
        from gh200rt.numa.alloc import allocate  # type: ignore[import-not-found]
    except ImportError:
        return PlainHostBuffer(nbytes, node)
    return allocate(nbytes, node=node, policy="bind")
