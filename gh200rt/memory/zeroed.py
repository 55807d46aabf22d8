"""Zeroed buffers whose pages cost nothing until used.

A KV pool must start as zeros (a masked attention score still multiplies the V row it masks, and garbage bytes can
read as NaN). On the CPU, ``torch.zeros`` writes every page at allocation: SmolLM2's default 2.6 GB arena took
3.9-5.5 s of a server's start on a Zen 3, for blocks most runs never use. A fresh private anonymous mapping is zero
already: the kernel supplies each page on its first touch, so the pool costs what it holds. The mapping is the
pool's own, not malloc's: once an engine raises glibc's mmap threshold (``backends/cpu/host_allocator.py``), calloc
serves anything below it from the heap and clears it with memset, which writes every page (a second engine's
pools, or a model's per-layer pools, all resident at once). The mapping is unmapped when the last tensor over it
goes. Other devices zero as before (one fast memset).
"""
from __future__ import annotations

import math
import mmap

import torch

PAGE = 4096      # buffers start on a page (torch aligns its own CPU allocations to 64 bytes; native kernels rely on it)


def zeroed(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str = "cpu") -> torch.Tensor:
    """``torch.zeros(shape, dtype=dtype, device=device)``; on the CPU over memory the kernel zeroes page by page."""
    nbytes = math.prod(shape) * dtype.itemsize
    if torch.device(device).type != "cpu" or not nbytes or not hasattr(mmap, "MAP_ANONYMOUS"):
        return torch.zeros(shape, dtype=dtype, device=device)
    region = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    return torch.frombuffer(region, dtype=torch.uint8).view(dtype).view(shape)   # the tensor keeps the mapping
