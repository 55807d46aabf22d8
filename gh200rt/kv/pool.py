"""The per-layer paged KV tensors and their size per block (the engine sizes the pool from the
device-memory ledger, gh200rt/engine/device_memory.py). Layer i's cache has shape
``[2, num_blocks, block_size, num_kv_heads, head_dim]`` (0 = K, 1 = V), allocated once and never
reallocated (CUDA graphs capture its address).
"""
from __future__ import annotations

import torch


def kv_bytes_per_block(num_layers: int, block_size: int, num_kv_heads: int, head_dim: int,
                       dtype: torch.dtype) -> int:
    return 2 * num_layers * block_size * num_kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()


def allocate_kv_caches(num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int,
                       dtype: torch.dtype, device: torch.device | str = "cpu") -> list[torch.Tensor]:
    return [torch.zeros(2, num_blocks, block_size, num_kv_heads, head_dim, dtype=dtype, device=device)
            for _ in range(num_layers)]
