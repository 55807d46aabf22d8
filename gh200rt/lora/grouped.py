"""The torch path of the batched LoRA matmul (the CPU's): per slot, one shrink and one expand over all its rows.

Same contract as the Triton kernels in ``kernels/triton/lora_sgmv.py`` (tested against the same per-token reference):
``y[t] += (x[t] @ A[s]^T) @ B[s]^T * scale[s]`` for the rows of each slot ``s``; other rows are left alone.

``block_rows`` (``--batch-invariant``): each slot's shrink and expand run on blocks of exactly that many of its
rows (``models/layers/row_blocks.py``, the rule the base linear follows), the delta is scaled on its own and then
added with a plain add, so a row's bits depend neither on how many rows share its adapter nor on whether they sit
in one run (a slice) or several (an index): a request under an adapter gets the same bits alone and in any batch.
"""
from __future__ import annotations

import torch

from gh200rt.models.layers.row_blocks import in_row_blocks


def lora_add_grouped(x: torch.Tensor, y: torch.Tensor, a: torch.Tensor, b: torch.Tensor, scales: list[float],
                     groups: list[tuple[int, slice | torch.Tensor]], block_rows: int | None = None) -> torch.Tensor:
    """The torch path: ``groups`` holds per slot its rows (a slice where they are consecutive, else an index
    tensor); one shrink and one expand matmul per slot. ``scales``: host floats (no device read per step)."""
    if block_rows is not None:
        return _lora_add_in_row_blocks(x, y, a, b, scales, groups, block_rows)
    for slot, rows in groups:
        if isinstance(rows, slice):
            y[rows].add_((x[rows] @ a[slot].T) @ b[slot].T, alpha=scales[slot])
        else:
            delta = (x.index_select(0, rows) @ a[slot].T) @ b[slot].T
            y.index_add_(0, rows, delta, alpha=scales[slot])
    return y


def _lora_add_in_row_blocks(x, y, a, b, scales, groups, block_rows: int) -> torch.Tensor:
    for slot, rows in groups:
        a_slot, b_slot = a[slot], b[slot]
        taken = x[rows] if isinstance(rows, slice) else x.index_select(0, rows)
        delta = in_row_blocks(lambda block: (block @ a_slot.T) @ b_slot.T, taken, block_rows).mul_(scales[slot])
        if isinstance(rows, slice):
            y[rows].add_(delta)
        else:
            y.index_add_(0, rows, delta)
    return y
