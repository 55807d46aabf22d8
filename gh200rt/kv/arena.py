"""The device arena: one buffer, allocated once, shared by the KV cache and resident layer weights.

The arena is ``num_blocks`` blocks of ``block_bytes`` = one KV block of every layer (K and V), laid
out block-major: block b holds ``[num_layers, 2, block_size, num_kv_heads, head_dim]`` at byte
``b * block_bytes``. So a run of consecutive block ids is contiguous memory, which a resident layer's
weights can occupy (``run``), and layer i's KV cache is a strided view with the usual shape
``[2, num_blocks, block_size, num_kv_heads, head_dim]`` (block stride = ``block_bytes``).
The cost: a layer's K (or V) for one block is ``block_size x heads x dim`` contiguous elements, as
before, but consecutive blocks of one layer are ``block_bytes`` apart instead of adjacent; attention
gathers block by block through the block table either way.

``pool`` (``block_pool.BlockPool``) hands blocks to requests and runs to weights. Nothing here
reallocates: every address attention kernels or a captured graph read stays put.
"""
from __future__ import annotations

from contextlib import contextmanager

import torch

from gh200rt.kv.block_pool import BlockPool
from gh200rt.memory.zeroed import zeroed


class DeviceArena:
    def __init__(self, num_blocks: int, num_layers: int, block_size: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device | str = "cpu", planes: int = 2):
        """``planes``: K and V (2), or latent attention's one (kv/pool.py)."""
        self.shape = (num_blocks, num_layers, planes, block_size, num_kv_heads, head_dim)
        self.dtype = dtype
        self.block_bytes = num_layers * planes * block_size * num_kv_heads * head_dim * dtype.itemsize
        self.buffer = zeroed((num_blocks * self.block_bytes,), torch.uint8, device)
        self.pool = BlockPool(num_blocks)
        self._take_at: int | None = None

    @property
    def num_blocks(self) -> int:
        return self.shape[0]

    @property
    def nbytes(self) -> int:
        return self.buffer.nbytes

    def blocks(self) -> torch.Tensor:
        """The arena as ``[num_blocks, num_layers, planes, block_size, num_kv_heads, head_dim]`` (block-major)."""
        return self.buffer.view(self.dtype).view(self.shape)

    def kv_caches(self) -> list[torch.Tensor]:
        """Layer i's paged KV cache, ``[planes, num_blocks, block_size, num_kv_heads, head_dim]``, over the arena."""
        blocks = self.blocks()
        return [blocks[:, layer].transpose(0, 1) for layer in range(self.shape[1])]

    def blocks_for(self, nbytes: int) -> int:
        return max(1, -(-nbytes // self.block_bytes))

    def run(self, start: int) -> torch.Tensor:
        """The bytes of the weight run that starts at block ``start``."""
        count = self.pool.runs[start]
        return self.buffer[start * self.block_bytes:(start + count) * self.block_bytes]

    def take_run(self, nbytes: int) -> int | None:
        """Blocks for ``nbytes`` of weights, contiguous; their first block, or None when no run is free."""
        return self.pool.take_run(self.blocks_for(nbytes), at=self._take_at)

    @contextmanager
    def taking_at(self, start: int):
        """Within it, a run is taken at block ``start`` (the run another rank's block manager chose: a
        tensor-parallel worker repeats rank 0's moves, distributed/placement_sync.py)."""
        assert self._take_at is None, self._take_at
        self._take_at = start
        try:
            yield
        finally:
            self._take_at = None

    def return_run(self, start: int) -> None:
        """Give a weight run back to the KV cache, zeroed: weight bytes read as K/V could be NaN, and a
        masked attention score still multiplies the V row it masks."""
        self.run(start).zero_()
        self.pool.return_run(start)
