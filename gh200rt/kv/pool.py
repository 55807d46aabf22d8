"""The per-layer paged KV tensors and their size per block (the engine sizes the pool from the
device-memory ledger, gh200rt/engine/device_memory.py). Layer i's cache has shape
``[planes, num_blocks, block_size, num_kv_heads, head_dim]``: two planes, K and V (0 = K, 1 = V), or one for
latent attention, whose keys are its values (``ArchConfig.kv_planes``, models/layers/mla.py), allocated once and
never reallocated (CUDA graphs capture its address).
"""
from __future__ import annotations

import torch

from gh200rt.memory.zeroed import zeroed


def kv_bytes_per_block(num_layers: int, block_size: int, num_kv_heads: int, head_dim: int,
                       dtype: torch.dtype, planes: int = 2) -> int:
    return planes * num_layers * block_size * num_kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()


def allocate_kv_caches(num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int,
                       dtype: torch.dtype, device: torch.device | str = "cpu", planes: int = 2) -> list[torch.Tensor]:
    return [zeroed((planes, num_blocks, block_size, num_kv_heads, head_dim), dtype, device) for _ in range(num_layers)]


def arch_kv_bytes_per_block(arch, block_size: int, dtype: torch.dtype) -> int:
    """``kv_bytes_per_block`` of a model's pool (``ArchConfig``: its planes, heads and width)."""
    return kv_bytes_per_block(arch.num_layers, block_size, arch.kv_cache_heads, arch.kv_cache_dim, dtype,
                              arch.kv_planes)


def allocate_arch_kv_caches(arch, num_blocks: int, block_size: int, dtype: torch.dtype,
                            device: torch.device | str = "cpu") -> list[torch.Tensor]:
    """``allocate_kv_caches`` for a model (``ArchConfig``)."""
    return allocate_kv_caches(arch.num_layers, num_blocks, block_size, arch.kv_cache_heads, arch.kv_cache_dim, dtype,
                              device, arch.kv_planes)
