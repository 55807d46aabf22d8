"""Host slabs: one exact-size contiguous host buffer per offloaded layer, bound to a NUMA node.

``allocate_slab(nbytes, node)`` returns a ``gh200rt.numa.alloc.HostBuffer`` (``.tensor`` uint8
[nbytes], ``.nbytes``, ``.address``, ``.free()``), mapped at exact size (page-rounded, never to a
power of two), bound to ``node``, advised for transparent huge pages and touched once so its pages
land there. Huge pages matter: a GEMV streaming a slab of 4 KiB pages misses the TLB (on the CPU
platform, decode from direct slabs went from 0.85x of resident to 1.07-1.29x once advised).
Without libnuma the slab still works, unbound, with a warning naming the package to install.
``check_node_has_room`` refuses up front what the node cannot hold.
"""
from __future__ import annotations

import re
from pathlib import Path

from gh200rt.numa.alloc import HostBuffer, allocate


def allocate_slab(nbytes: int, node: int = 0, touch: bool = True) -> HostBuffer:
    """``touch=False``: the caller writes every byte next (a read from the slab cache), which places the pages."""
    if nbytes <= 0:
        raise ValueError(f"slab size must be positive, got {nbytes}")
    return allocate(nbytes, node=node, policy="bind", hugepages=True, allow_unbound=True, touch=touch)


def node_available_bytes(node: int, sysfs_root: str | Path = "/sys") -> int | None:
    """Memory node ``node`` can still give: free pages plus page cache (reclaimable); None when unknown."""
    text = _read(Path(sysfs_root) / f"devices/system/node/node{node}/meminfo")
    fields = dict(re.findall(r"Node \d+ (\S+):\s+(\d+) kB", text))
    if "MemFree" not in fields:
        return None
    return (int(fields["MemFree"]) + int(fields.get("FilePages", 0))) * 1024


def check_node_has_room(nbytes: int, node: int, sysfs_root: str | Path = "/sys") -> None:
    """Refuse, with the numbers, slabs that cannot fit on ``node``: memory bound there (MPOL_BIND) beyond
    what the node has gets the process killed by the kernel, with no Python error at all."""
    available = node_available_bytes(node, sysfs_root)
    if available is None or nbytes <= available:
        return
    raise ValueError(f"the offloaded weights need {nbytes / 2**30:.2f} GiB of host memory on NUMA node {node} "
                     f"(the one nearest the GPU), but that node has only {available / 2**30:.2f} GiB free; "
                     f"binding them there would get the process killed. Free memory on node {node}, offload "
                     f"fewer layers (--offload / --layer-tiers), or store them smaller (--host-weight-dtype int8 "
                     f"or int4)")


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""
