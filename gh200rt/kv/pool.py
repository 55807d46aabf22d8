"""How many KV blocks fit, and the per-layer paged KV tensors themselves.

``kv_blocks_for_budget`` is the single place the pool size is derived from a memory budget; the
tiers ledger/planner replaces its body. Layer i's cache has shape
``[2, num_blocks, block_size, num_kv_heads, head_dim]`` (0 = K, 1 = V), allocated once and never
reallocated (CUDA graphs capture its address).
"""
from __future__ import annotations

import torch

CPU_DEFAULT_BUDGET_BYTES = 2 * 1024**3


def kv_bytes_per_block(num_layers: int, block_size: int, num_kv_heads: int, head_dim: int,
                       dtype: torch.dtype) -> int:
    return 2 * num_layers * block_size * num_kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()


def kv_blocks_for_budget(budget_bytes: int | None, weight_bytes: int, bytes_per_block: int) -> int:
    """Blocks that fit in what the budget leaves after the weights (CPU without a budget: 2 GiB)."""
    budget = CPU_DEFAULT_BUDGET_BYTES if budget_bytes is None else budget_bytes
    return max(0, (budget - weight_bytes) // bytes_per_block)


def resolve_num_kv_blocks(num_kv_blocks: int | None, budget_bytes: int | None, weight_bytes: int,
                          bytes_per_block: int, block_size: int, max_model_len: int) -> int:
    """The explicit override or the budget's share; at least one max_model_len sequence must fit."""
    needed = -(-max_model_len // block_size)
    blocks = num_kv_blocks if num_kv_blocks is not None else kv_blocks_for_budget(
        budget_bytes, weight_bytes, bytes_per_block)
    if blocks < needed:
        source = (f"--num-kv-blocks {num_kv_blocks}" if num_kv_blocks is not None else
                  f"the device memory budget ({budget_bytes or CPU_DEFAULT_BUDGET_BYTES} bytes, "
                  f"{weight_bytes} of them weights, {bytes_per_block} bytes per block)")
        raise ValueError(
            f"the KV cache has {blocks} blocks of {block_size} tokens from {source}, but one sequence of "
            f"--max-model-len {max_model_len} needs {needed}; raise --num-kv-blocks or "
            f"--device-memory-budget, or lower --max-model-len")
    return blocks


def allocate_kv_caches(num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int,
                       dtype: torch.dtype, device: torch.device | str = "cpu") -> list[torch.Tensor]:
    return [torch.zeros(2, num_blocks, block_size, num_kv_heads, head_dim, dtype=dtype, device=device)
            for _ in range(num_layers)]
