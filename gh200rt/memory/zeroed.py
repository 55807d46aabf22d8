"""Zeroed buffers whose pages cost nothing until used.

A KV pool must start as zeros (a masked attention score still multiplies the V row it masks, and garbage bytes can
read as NaN). On the CPU, ``torch.zeros`` writes every page at allocation: SmolLM2's default 2.6 GB arena took
3.9-5.5 s of a server's start on a Zen 3, for blocks most runs never use. A fresh anonymous mapping is zero
already (calloc, which ``numpy.zeros`` calls, knows it and writes nothing): the kernel supplies each page on its first
touch, so the pool costs what it holds. Other devices zero as before (one fast memset).
"""
from __future__ import annotations

import math

import numpy as np
import torch

PAGE = 4096      # buffers start on a page (torch aligns its own CPU allocations to 64 bytes; native kernels rely on it)


def zeroed(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str = "cpu") -> torch.Tensor:
    """``torch.zeros(shape, dtype=dtype, device=device)``; on the CPU over memory the kernel zeroes page by page."""
    if torch.device(device).type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    nbytes = math.prod(shape) * dtype.itemsize
    raw = np.zeros(nbytes + PAGE, dtype=np.uint8)
    start = -raw.ctypes.data % PAGE
    return torch.from_numpy(raw[start:start + nbytes]).view(dtype).view(shape)
