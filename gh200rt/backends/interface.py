"""What every backend fills in: the layers' swap hooks, and the torch ops that fill them by default.

A model's layers call their small ops through hooks (``SelfAttention.rotary_fn`` / ``write_kv_fn`` /
``attention_fn`` / ``decode_block_fn``, ``LatentAttention``'s first three from ``ops["latent_attention"]`` where a
backend's kernels take its one-plane pool and 576-wide rows, else the torch ops, and its ``prefill_fn`` from
``ops["latent_prefill"]`` (default none), ``RMSNorm.norm_fn`` / ``add_norm_fn``, ``SiluAndMul.act_fn``,
``SparseMoeBlock.fused_experts_fn``, ``DecoderLayer.decode_layer_fn``, and a linear's dense route and native packed
route, ``RefLinear.dense_fn`` / ``packed_native``). A backend is a table of ops for those hooks
(``backends/cuda/ops.py``: Triton; ``backends/cpu/ops.py``: the native C ops); ``switch_hooks(model, ops)`` points
every hook of a model at one table, and ``TORCH_OPS`` is the table of plain torch ops that every backend falls back
to. Each op takes exactly what the layer passes and returns what the torch op returns.
"""
from __future__ import annotations

import torch

from gh200rt.kv import attention as torch_attention
from gh200rt.models.layers import activation, attention, linear, rmsnorm, rotary
from gh200rt.models.layers.dense import dense_linear
from gh200rt.models.layers.mla import LatentAttention
from gh200rt.models.moe import SparseMoeBlock

# A backend's one-call decode layer keeps what it resolved of a layer in the layer's __dict__ under names with this
# prefix; a layer whose hooks change forgets them (switch_hooks).
DECODE_STATE_PREFIX = "_decode_layer_state_"

TORCH_OPS = dict(rotary=lambda: rotary.apply_rotary, write_kv=torch_attention.write_kv,
                 attention=torch_attention.paged_attention, norm=rmsnorm.rms_norm, act=activation.silu_and_mul,
                 packed_native=False)
# a latent attention layer's (rotary, write_kv, attention) where a backend names none of its own
TORCH_LATENT_OPS = (rotary.apply_rotary, torch_attention.write_kv, torch_attention.paged_attention)


def forget_decode_state(layer: torch.nn.Module) -> None:
    """Drop what a backend's decode layer cached of ``layer`` (its hooks changed)."""
    for name in [name for name in layer.__dict__ if name.startswith(DECODE_STATE_PREFIX)]:
        del layer.__dict__[name]


def switch_hooks(model: torch.nn.Module, ops: dict) -> int:
    """Point every hook in ``model`` at ``ops``; returns how many modules were switched. Linears' dense route
    (``RefLinear.dense_fn``) follows ``ops["dense_linear"]`` (default ``dense_linear``), their packed weights'
    native CPU kernel ``ops["packed_native"]`` (default on) and a decoder layer's one-call decode path
    (``decode_layer_fn``) ``ops["decode_layer"]`` (default none), an MoE block's experts a new
    ``ops["moe"]()`` (default none: the grouped torch path), a model's one-call decoder stack (``decode_stack_fn``)
    ``ops["decode_stack"]`` (default none); none of these is counted."""
    switched = 0
    rotate = ops["rotary"]()        # one per model: it may keep the step's cos|sin table (TritonRotary)
    for module in model.modules():
        if isinstance(module, linear.RefLinear):
            module.dense_fn = ops.get("dense_linear", dense_linear)
            module.packed_native = ops.get("packed_native", True)
            continue
        if isinstance(module, SparseMoeBlock):
            fused = ops.get("moe")
            module.fused_experts_fn = fused() if fused is not None else None
        if hasattr(module, "decode_stack_fn"):  # a model: its decoder layers in one call, where the ops have it
            module.decode_stack_fn = ops.get("decode_stack")
            forget_decode_state(module)
        if hasattr(module, "decode_layer_fn"):  # a decoder layer: its one-call decode path, where the ops have one
            module.decode_layer_fn = ops.get("decode_layer")
            forget_decode_state(module)
            continue
        if isinstance(module, attention.SelfAttention):
            module.rotary_fn, module.write_kv_fn, module.attention_fn = rotate, ops["write_kv"], ops["attention"]
            module.decode_block_fn = ops.get("decode_block")
        elif isinstance(module, LatentAttention):
            module.rotary_fn, module.write_kv_fn, module.attention_fn = ops.get("latent_attention", TORCH_LATENT_OPS)
            module.prefill_fn = ops.get("latent_prefill")
        elif isinstance(module, rmsnorm.RMSNorm):
            module.norm_fn, module.add_norm_fn = ops["norm"], ops.get("add_norm")
        elif isinstance(module, activation.SiluAndMul):
            module.act_fn = ops["act"]
        else:
            continue
        switched += 1
    return switched


def use_torch_kernels(model: torch.nn.Module) -> int:
    return switch_hooks(model, TORCH_OPS)
