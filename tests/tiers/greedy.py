"""Greedy decoding of one sequence straight through a model (no engine): a prompt prefill, then one token
per step, the weight store's hooks driven as the model runner drives them. The tier tests compare the
logits of every step bit for bit across placements."""
from __future__ import annotations

from typing import Callable

import torch

from gh200rt.engine.model_runner import forward
from gh200rt.kv.pool import allocate_kv_caches
from gh200rt.models.base import AttentionMetadata
from gh200rt.weights.schedule import NULL_HOOKS

BLOCK = 16


def greedy(model, prompt: list[int], steps: int, num_blocks: int, hooks=NULL_HOOKS,
           kv_dtype: torch.dtype = torch.float32,
           between_steps: Callable[[int], None] | None = None) -> tuple[torch.Tensor, list[int]]:
    """(logits of the last position of every step [steps, V], prompt + chosen tokens); ``between_steps(i)``
    runs before step i (e.g. to move layers between tiers)."""
    arch = model.arch
    kv = allocate_kv_caches(arch.num_layers, num_blocks, BLOCK, arch.num_kv_heads, arch.head_dim, kv_dtype)
    table = list(range(num_blocks))
    tokens, all_logits, query = list(prompt), [], len(prompt)
    for step in range(steps):
        if between_steps is not None:
            between_steps(step)
        meta = AttentionMetadata.build([query], [len(tokens)], [table], BLOCK)
        pos = torch.arange(len(tokens) - query, len(tokens))
        logits = model.compute_logits(forward(model, torch.tensor(tokens[-query:]), pos, meta, kv, hooks))[-1]
        all_logits.append(logits)
        tokens.append(int(logits.argmax()))
        query = 1
    return torch.stack(all_logits), tokens
