"""A row-wise function (a linear, the logits head) computed on blocks of a fixed number of rows, so that a row's
bits do not depend on the rows computed beside it.

A GEMM library picks its kernel, and so the order in which it sums a row, from the shape of the call: on an AMX
CPU oneDNN's bf16 inner product sums a row one way up to 32 rows and another way above, and the CPU routes send a
few rows to native kernels and more to oneDNN or fbgemm (docs/BENCHMARKS.md, prefix-cache invariance). Within one
shape, every row of a call is computed alike. Cut into blocks of exactly ``rows`` rows, the last padded with zero
rows, a call gives a row the same bits whichever rows share it and wherever the row sits: a prompt position then
computes alike in a full prefill, after a cached prefix, in any prefill chunk and beside any other requests.
"""
from __future__ import annotations

from typing import Callable

import torch


def in_row_blocks(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, rows: int) -> torch.Tensor:
    """``fn(x)`` for a row-wise ``fn`` (``[M, K] -> [M, N]``, rows independent), computed as calls on blocks of
    exactly ``rows`` rows of ``x [..., K]``."""
    assert rows > 0, rows
    flat = x.reshape(-1, x.shape[-1])
    count = flat.shape[0]
    if count == 0:
        return fn(x)
    if count % rows:
        flat = torch.cat([flat, flat.new_zeros(rows - count % rows, flat.shape[-1])])
    elif not flat.is_contiguous():
        flat = flat.contiguous()
    blocks = [fn(block) for block in flat.split(rows)]
    out = blocks[0] if len(blocks) == 1 else torch.cat(blocks)
    return out[:count].reshape(*x.shape[:-1], out.shape[-1])
