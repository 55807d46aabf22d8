"""A decoder layer of a one-row decode step on CUDA in six launches instead of nine (``DecoderLayer.decode_layer_fn``
with the Triton kernels on, models/gpu_kernels.py):

    qkv = gemv(hidden, W_qkv, norm=input_layernorm)         # the RMSNorm fused before the product
    att = rope_and_store_kv, paged_attention                # SelfAttention.decode_block_fn's two launches
    mid = gemv(att, W_o, residual=hidden)                   # the residual add fused after it
    gu  = gemv(mid, W_gate_up, norm=post_attention_layernorm)
    out = gemv(gu, W_down, gated=True, residual=mid)        # SiLU(gate) * up before, the residual add after

On an H100 at batch 1 (docs/gpu-runs/h100-2026-11-26b) the GEMVs took 5.18 of a step's 5.77 ms of device time,
the norms, SiLU-mul and residual adds 0.29 ms more in 129 launches, and ~0.6 ms went idle between the step's 344
kernels: those launches are what this removes (the residual add at the end of a layer was a launch of its own
then; it has since moved into the next layer's input norm on the op-by-op path too). Each fused step rounds where
the unfused kernel stores, so a layer gives the op-by-op Triton path's bits (tests/model/test_fused_decode_layer.py).

Anything else returns None and the layer runs op by op: more than one row, a layer whose four linears are not
dense tensors of the activations' dtype and device with contiguous rows (packed or host-read weights, a LoRA
adapter, a bias other than q/k/v's), a KV-scale calibration, a block size that is not a power of two.
"""
from __future__ import annotations

import torch


def gpu_decode_layer(layer, hidden: torch.Tensor, residual: torch.Tensor | None, cos: torch.Tensor,
                     sin: torch.Tensor, meta, kv_cache: torch.Tensor) -> torch.Tensor | None:
    """The hook: CUDA activations only (the Triton kernels on CPU tensors under the interpreter keep the op-by-op
    path, as ``triton_dense_linear`` does)."""
    if not hidden.is_cuda:
        return None
    return fused_decode_layer(layer, hidden, residual, cos, sin, meta, kv_cache)


def fused_decode_layer(layer, hidden: torch.Tensor, residual: torch.Tensor | None, cos: torch.Tensor,
                       sin: torch.Tensor, meta, kv_cache: torch.Tensor) -> torch.Tensor | None:
    """``layer(hidden + residual, ...)`` (``residual`` None: ``hidden``: the input as ``forward_deferred`` takes it)
    for one row in the six launches above, or None where they do not apply. A residual comes only after a layer
    that ran op by op; its add is then a launch of its own."""
    from gh200rt.kernels.gemv import MAX_NORM_COLUMNS, gemv     # triton is an extra: imported once this runs
    attn, mlp = layer.self_attn, layer.mlp
    block_size = kv_cache.shape[2]
    if hidden.shape[0] != 1 or hidden.shape[-1] > MAX_NORM_COLUMNS or attn.calculate_kv_scales \
            or block_size & (block_size - 1):
        return None
    linears = (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj)
    weights = [_dense_weight(linear, hidden) for linear in linears]
    if any(w is None for w in weights) or any(linear.bias is not None for linear in linears[1:]):
        return None
    from gh200rt.kernels.paged_attention import paged_attention
    from gh200rt.kernels.rope_store_kv import rope_and_store_kv
    w_qkv, w_o, w_gate_up, w_down = weights
    if residual is not None:
        hidden = hidden + residual
    first_norm, second_norm = layer.input_layernorm, layer.post_attention_layernorm
    qkv = gemv(hidden, w_qkv, attn.qkv_proj.bias, norm=(first_norm.weight, first_norm.eps))
    qk_norm = None if attn.q_norm is None else (attn.q_norm.weight, attn.k_norm.weight, attn.q_norm.eps)
    q = rope_and_store_kv(qkv, cos, sin, kv_cache, meta.slot_mapping, attn.num_heads, attn.num_kv_heads,
                          attn.kv_scale, qk_norm)
    attended = paged_attention(q, kv_cache, meta, attn.scale, attn.num_kv_heads, attn.kv_scale)
    mid = gemv(attended.reshape(1, attn.q_size), w_o, residual=hidden)
    gate_up = gemv(mid, w_gate_up, norm=(second_norm.weight, second_norm.eps))
    return gemv(gate_up, w_down, gated=True, residual=mid)


def _dense_weight(linear, hidden: torch.Tensor) -> torch.Tensor | None:
    weight = linear.weight_ref.current
    if linear.lora is not None or not isinstance(weight, torch.Tensor) or weight.device != hidden.device \
            or weight.dtype != hidden.dtype or weight.stride(-1) != 1:
        return None
    return weight
