"""The torch path of the batched LoRA matmul (the CPU's): per slot, one shrink and one expand over all its rows.

Same contract as the Triton kernels in ``kernels/lora_sgmv.py`` (tested against the same per-token reference):
``y[t] += (x[t] @ A[s]^T) @ B[s]^T * scale[s]`` for the rows of each slot ``s``; other rows are left alone.
"""
from __future__ import annotations

import torch


def lora_add_grouped(x: torch.Tensor, y: torch.Tensor, a: torch.Tensor, b: torch.Tensor, scales: list[float],
                     groups: list[tuple[int, slice | torch.Tensor]]) -> torch.Tensor:
    """The torch path: ``groups`` holds per slot its rows (a slice where they are consecutive, else an index
    tensor); one shrink and one expand matmul per slot. ``scales``: host floats (no device read per step)."""
    for slot, rows in groups:
        if isinstance(rows, slice):
            y[rows].add_((x[rows] @ a[slot].T) @ b[slot].T, alpha=scales[slot])
        else:
            delta = (x.index_select(0, rows) @ a[slot].T) @ b[slot].T
            y.index_add_(0, rows, delta, alpha=scales[slot])
    return y
