"""One tensor-parallel rank's slice of a LoRA adapter, cut like its base linears (``distributed/sharding.py``).

Column-parallel linears (q/k/v, gate/up) keep their output rows on the rank, so each part's ``B`` is cut to the
rank's rows and ``A`` stays whole: the rank's delta is its rows of the full delta. Row-parallel linears (o, down)
keep their input columns, so ``A`` is cut to those columns and ``B`` stays whole: the rank's delta is a partial
sum that joins the base output's partial sum before the all-reduce the layer already makes (no extra collective).
K/V rows follow the rank's KV heads, split or replicated as the base model's. Latent attention (DeepSeek) is cut as
its weights are: q_b_proj and kv_b_proj by the rank's heads' rows, o_proj by their value columns, q_a_proj and
kv_a_proj_with_mqa whole (every rank computes the same latent row). The result has the shapes
``target_shapes(shard.local_arch(), layer)`` gives, so the rank's slots and ``LoraSlots.load`` take it as is.
"""
from __future__ import annotations

import dataclasses

import torch

from gh200rt.lora.peft_adapter import LoraAdapter

COLUMN_PARALLEL = ("self_attn.qkv_proj", "mlp.gate_up_proj", "self_attn.q_b_proj", "self_attn.kv_b_proj")
ROW_PARALLEL = ("self_attn.o_proj", "mlp.down_proj")
REPLICATED = ("self_attn.q_a_proj", "self_attn.kv_a_proj_with_mqa")


def _row_ranges(shard, target: str) -> list[tuple[int, int]]:
    """Per part of a column-parallel target, the rank's output rows."""
    d, a = shard.arch.head_dim, shard.arch
    if target in ("self_attn.q_b_proj", "self_attn.kv_b_proj"):
        width = shard.num_heads * (a.qk_nope_head_dim + (d if target == "self_attn.q_b_proj" else a.v_head_dim))
        return [(shard.rank * width, (shard.rank + 1) * width)]
    if target == "self_attn.qkv_proj":
        q = (shard.rank * shard.num_heads * d, (shard.rank + 1) * shard.num_heads * d)
        kv = (shard.kv_head_start * d, (shard.kv_head_start + shard.num_kv_heads) * d)
        return [q, kv, kv]
    i = shard.intermediate_size
    return [(shard.rank * i, (shard.rank + 1) * i)] * 2


def _column_range(shard, target: str) -> tuple[int, int]:
    """The rank's input columns of a row-parallel target."""
    a = shard.arch
    head_width = a.v_head_dim if a.is_mla else a.head_dim
    width = shard.num_heads * head_width if target == "self_attn.o_proj" else shard.intermediate_size
    return shard.rank * width, (shard.rank + 1) * width


def shard_adapter(adapter: LoraAdapter, shard) -> LoraAdapter:
    """``adapter`` as rank ``shard.rank`` of ``shard.world_size`` holds it (``shard``: a ``TensorShard``)."""
    weights: dict[tuple[int, str], list[tuple[torch.Tensor, torch.Tensor] | None]] = {}
    for (layer, target), parts in adapter.weights.items():
        if target in REPLICATED:
            weights[(layer, target)] = parts
        elif target in COLUMN_PARALLEL:
            ranges = _row_ranges(shard, target)
            weights[(layer, target)] = [None if pair is None else (pair[0], pair[1][lo:hi].contiguous())
                                        for pair, (lo, hi) in zip(parts, ranges)]
        else:
            assert target in ROW_PARALLEL, target
            lo, hi = _column_range(shard, target)
            weights[(layer, target)] = [None if pair is None else (pair[0][:, lo:hi].contiguous(), pair[1])
                                        for pair in parts]
    return dataclasses.replace(adapter, weights=weights)
