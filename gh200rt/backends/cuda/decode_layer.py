"""A decoder layer of a decode step on CUDA in six launches instead of nine (``DecoderLayer.decode_layer_fn`` with
the Triton kernels on, backends/cuda/ops.py):

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

A step of 2 to ``max_rows`` sequences (``--fused-decode-rows``, default 1) takes the same six launches with
``fused_rows`` (kernels/triton/fused_rows.py: tensor-core tiles, no split over K) for the GEMVs, bf16/fp16 only; at batch 8
the op-by-op layer is 9 launches of which cuBLAS's products and split-K reductions are 6. Its products sum in
another order than cuBLAS's, so it agrees with the op-by-op path to rounding, not bit for bit.

With ``pdl`` (``--enable-pdl``) the six launches use programmatic dependent launch (kernels/triton/pdl.py): each may be
scheduled while the one before it drains, and waits for it before touching memory, so the step keeps its values
and loses the launch gaps between them.

Anything else returns None and the layer runs op by op: more rows, a step that is not all decodes, a layer whose
four linears are not dense tensors of the activations' dtype and device with contiguous rows (packed or host-read
weights, a LoRA adapter, a bias other than q/k/v's), a KV-scale calibration, a block size that is not a power of
two.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from gh200rt.kv.host_blocks import host_view

# several rows multiply on tensor cores over TF32 operands (kernels/triton/fused_rows.py): exact for 16-bit values only
MULTI_ROW_DTYPES = (torch.bfloat16, torch.float16)


@dataclass(frozen=True)
class GpuDecodeLayer:
    """The hook for decode steps of up to ``max_rows`` rows: CUDA activations only (the Triton kernels on CPU
    tensors under the interpreter keep the op-by-op path, as ``triton_dense_linear`` does). ``pdl``: the layer's
    launches use programmatic dependent launch (kernels/triton/pdl.py; sm_90+)."""
    max_rows: int = 1
    pdl: bool = False

    def __call__(self, layer, hidden: torch.Tensor, residual: torch.Tensor | None, cos: torch.Tensor,
                 sin: torch.Tensor, meta, kv_cache: torch.Tensor) -> torch.Tensor | None:
        if not hidden.is_cuda:
            return None
        return fused_decode_layer(layer, hidden, residual, cos, sin, meta, kv_cache, self.max_rows, self.pdl)


gpu_decode_layer = GpuDecodeLayer()


def fused_decode_layer(layer, hidden: torch.Tensor, residual: torch.Tensor | None, cos: torch.Tensor,
                       sin: torch.Tensor, meta, kv_cache: torch.Tensor, max_rows: int = 1,
                       pdl: bool = False) -> torch.Tensor | None:
    """``layer(hidden + residual, ...)`` (``residual`` None: ``hidden``: the input as ``forward_deferred`` takes it)
    for up to ``max_rows`` rows in the six launches above, or None where they do not apply. A residual comes only
    after a layer that ran op by op; its add is then a launch of its own."""
    from gh200rt.kernels.triton.gemv import MAX_NORM_COLUMNS  # triton is an extra: imported once this runs
    attn, mlp = layer.self_attn, layer.mlp
    block_size = kv_cache.shape[2]
    rows = hidden.shape[0]
    if not 1 <= rows <= max_rows or hidden.shape[-1] > MAX_NORM_COLUMNS or attn.calculate_kv_scales \
            or block_size & (block_size - 1) or max(meta.query_lens_list) != 1 \
            or (rows > 1 and hidden.dtype not in MULTI_ROW_DTYPES):
        return None
    linears = (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj)
    weights = [_dense_weight(linear, hidden) for linear in linears]
    if any(w is None for w in weights) or any(linear.bias is not None for linear in linears[1:]):
        return None
    from gh200rt.kernels.triton.paged_attention import paged_attention
    from gh200rt.kernels.triton.rope_store_kv import rope_and_store_kv
    product = _one_row_product if rows == 1 else _rows_product
    w_qkv, w_o, w_gate_up, w_down = weights
    if residual is not None:
        hidden = hidden + residual
    first_norm, second_norm = layer.input_layernorm, layer.post_attention_layernorm
    qkv = product(hidden, w_qkv, attn.qkv_proj.bias, norm=(first_norm.weight, first_norm.eps), pdl=pdl)
    qk_norm = None if attn.q_norm is None else (attn.q_norm.weight, attn.k_norm.weight, attn.q_norm.eps)
    q = rope_and_store_kv(qkv, cos, sin, kv_cache, meta.slot_mapping, attn.num_heads, attn.num_kv_heads,
                          attn.kv_scale, qk_norm, pdl=pdl)
    attended = paged_attention(q, kv_cache, meta, attn.scale, attn.num_kv_heads, attn.kv_scale, pdl=pdl,
                               host=host_view(meta, kv_cache))
    mid = product(attended.reshape(rows, attn.q_size), w_o, residual=hidden, pdl=pdl)
    gate_up = product(mid, w_gate_up, norm=(second_norm.weight, second_norm.eps), pdl=pdl)
    return product(gate_up, w_down, gated=True, residual=mid, pdl=pdl)


def _one_row_product(x, weight, bias=None, **fused):
    from gh200rt.kernels.triton.gemv import gemv
    return gemv(x, weight, bias, **fused)


def _rows_product(x, weight, bias=None, **fused):
    from gh200rt.kernels.triton.fused_rows import fused_rows
    return fused_rows(x, weight, bias, **fused)


def _dense_weight(linear, hidden: torch.Tensor) -> torch.Tensor | None:
    weight = linear.weight_ref.current
    if linear.lora is not None or not isinstance(weight, torch.Tensor) or weight.device != hidden.device \
            or weight.dtype != hidden.dtype or weight.stride(-1) != 1:
        return None
    return weight
