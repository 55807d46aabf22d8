"""Model-side self-attention: fused qkv projection, optional per-head q/k RMSNorm (Qwen3), RoPE (over the first
``rope_dim`` dimensions of each head where the architecture rotates only those: GLM-4.5),
K/V written to the paged pool, paged attention, output projection. ``kv_scale`` ([K scale, V scale],
float32) is what an fp8 pool is quantized with (kv/fp8.py); a bf16/fp32 pool ignores it."""
from __future__ import annotations

import torch
from torch import nn

from gh200rt.kv import fp8
from gh200rt.kv.attention import paged_attention, write_kv
from gh200rt.models.arch_config import ArchConfig
from gh200rt.models.base import AttentionMetadata
from gh200rt.models.layers.linear import RefLinear
from gh200rt.models.layers.rmsnorm import RMSNorm
from gh200rt.models.layers.rotary import apply_rotary


class SelfAttention(nn.Module):
    def __init__(self, arch: ArchConfig, dtype: torch.dtype, device: torch.device | str = "cpu"):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = arch.num_heads, arch.num_kv_heads, arch.head_dim
        self.q_size, self.kv_size = arch.q_size, arch.kv_size
        self.rope_dim = arch.rope_dim
        self.partial_rotary = arch.rope_dim < arch.head_dim
        self.scale = self.head_dim ** -0.5
        self.qkv_proj = RefLinear(arch.hidden_size, self.q_size + 2 * self.kv_size, arch.attention_bias, dtype, device)
        self.o_proj = RefLinear(self.q_size, arch.hidden_size, False, dtype, device)
        self.q_norm = RMSNorm(self.head_dim, arch.rms_norm_eps, dtype, device) if arch.qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, arch.rms_norm_eps, dtype, device) if arch.qk_norm else None
        # not persistent: checkpoints that carry K/V scales are read by the loader (k_scale / v_scale)
        self.register_buffer("kv_scale", torch.ones(2, dtype=torch.float32, device=device), persistent=False)
        self.calculate_kv_scales = False  # set the scales from the next batch (--calculate-kv-scales)
        # each may be swapped for the Triton kernel with the same signature (backends/cuda/ops.py)
        self.rotary_fn = apply_rotary
        self.write_kv_fn = write_kv
        self.attention_fn = paged_attention
        # the three above in one call (native CPU ops: a decode-only step; Triton: RoPE and the store in one
        # launch, q/k norms included): returns the attention output, or None where it does not apply (the step,
        # pool or layer are outside what it covers)
        self.decode_block_fn = None

    def forward(self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, meta: AttentionMetadata,
                kv_cache: torch.Tensor) -> torch.Tensor:
        tokens = hidden.shape[0]
        qkv = self.qkv_proj(hidden, meta.linear_rows)
        if self.decode_block_fn is not None and not self.calculate_kv_scales and not self.partial_rotary:
            qk_norm = None if self.q_norm is None else (self.q_norm.weight, self.k_norm.weight, self.q_norm.eps)
            out = self.decode_block_fn(qkv, cos, sin, kv_cache, meta, self.scale, self.num_heads, self.num_kv_heads,
                                       self.kv_scale, qk_norm)
            if out is not None:
                return self.o_proj(out.reshape(tokens, self.q_size), meta.linear_rows)
        heads = self.num_heads + self.num_kv_heads
        v = qkv[:, self.q_size + self.kv_size:].view(tokens, self.num_kv_heads, self.head_dim)
        if self.q_norm is None:
            qk = self._rotate(qkv[:, :self.q_size + self.kv_size].view(tokens, heads, self.head_dim), cos, sin)
            q, k = qk[:, :self.num_heads], qk[:, self.num_heads:]
        else:
            q = self.q_norm(qkv[:, :self.q_size].view(tokens, self.num_heads, self.head_dim))
            k = self.k_norm(qkv[:, self.q_size:self.q_size + self.kv_size].view(tokens, self.num_kv_heads,
                                                                                 self.head_dim))
            q, k = self._rotate(q, cos, sin), self._rotate(k, cos, sin)
        if self.calculate_kv_scales and fp8.is_fp8(kv_cache.dtype):
            self.kv_scale.copy_(fp8.calculated_scales(k, v, kv_cache.dtype))
            self.calculate_kv_scales = False
        self.write_kv_fn(kv_cache, k, v, meta.slot_mapping, self.kv_scale)
        out = self.attention_fn(q, kv_cache, meta, self.scale, self.num_kv_heads, self.kv_scale)
        return self.o_proj(out.reshape(tokens, self.q_size), meta.linear_rows)

    def _rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        if not self.partial_rotary:
            return self.rotary_fn(x, cos, sin)
        return torch.cat((self.rotary_fn(x[..., :self.rope_dim], cos, sin), x[..., self.rope_dim:]), dim=-1)


def configure_kv_scales(model: torch.nn.Module, calculate: bool) -> int:
    """Arm (or disarm) every attention layer of ``model`` to set its scales from the next batch it sees;
    returns how many layers were set."""
    layers = [m for m in model.modules() if isinstance(m, SelfAttention)]
    for layer in layers:
        layer.calculate_kv_scales = calculate
    return len(layers)
