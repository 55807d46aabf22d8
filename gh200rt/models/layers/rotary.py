"""Rotary position embedding (rotate-half layout) with default, linear, llama3 and YaRN frequency scaling.

cos/sin tables are precomputed in float32 for every position up to ``max_positions`` exactly as
transformers computes them (``inv_freq * position`` in float32; YaRN's tables times its attention factor), then
indexed by absolute position. A checkpoint that stores its rotary pairs interleaved (DeepSeek's ``rope_interleave``)
is read through ``deinterleave`` first: rotate-half over the de-interleaved dimensions is its rotation, with the
output in the layout transformers gives.
"""
from __future__ import annotations

import math

import torch
from torch import nn


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def attention_factor(scaling: dict | None) -> float:
    """What YaRN multiplies the cos/sin tables by (1 for every other kind)."""
    if not scaling or scaling.get("rope_type") != "yarn":
        return 1.0
    if scaling.get("attention_factor") is not None:
        return float(scaling["attention_factor"])
    factor, mscale, mscale_all = scaling["factor"], scaling.get("mscale"), scaling.get("mscale_all_dim")
    if mscale and mscale_all:
        return yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all)
    return yarn_mscale(factor)


def _yarn(head_dim: int, theta: float, scaling: dict) -> torch.Tensor:
    factor, old_len = scaling["factor"], scaling["original_max_position_embeddings"]
    fast, slow = scaling.get("beta_fast") or 32, scaling.get("beta_slow") or 1

    def correction_dim(rotations: float) -> float:
        return head_dim * math.log(old_len / (rotations * 2 * math.pi)) / (2 * math.log(theta))
    low, high = correction_dim(fast), correction_dim(slow)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001
    pos_freqs = theta ** (torch.arange(0, head_dim, 2).float() / head_dim)
    ramp = torch.clamp((torch.arange(head_dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    extrapolation = 1 - ramp
    return (1.0 / (factor * pos_freqs)) * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation


def inverse_frequencies(head_dim: int, theta: float, scaling: dict | None) -> torch.Tensor:
    kind = scaling.get("rope_type") if scaling else None
    if kind == "yarn":
        return _yarn(head_dim, theta, scaling)
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    if kind == "linear":
        return inv_freq / scaling["factor"]
    if kind == "llama3":
        factor = scaling["factor"]
        low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
        old_len = scaling["original_max_position_embeddings"]
        low_wavelen, high_wavelen = old_len / low, old_len / high
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
        smooth = (old_len / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
        return torch.where(medium, smoothed, scaled)
    return inv_freq


class RotaryEmbedding(nn.Module):
    def __init__(self, head_dim: int, max_positions: int, theta: float, scaling: dict | None,
                 device: torch.device | str = "cpu"):
        super().__init__()
        inv_freq = inverse_frequencies(head_dim, theta, scaling).to(device)
        positions = torch.arange(max_positions, device=device, dtype=torch.float32)
        freqs = positions[:, None] * inv_freq[None, :]
        factor = attention_factor(scaling)
        self.register_buffer("cos", freqs.cos() * factor if factor != 1.0 else freqs.cos(), persistent=False)
        self.register_buffer("sin", freqs.sin() * factor if factor != 1.0 else freqs.sin(), persistent=False)

    def tables(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin ``[T, 1, head_dim/2]`` in ``dtype`` (compute once per step, reuse in every layer)."""
        return self.cos[positions].to(dtype)[:, None, :], self.sin[positions].to(dtype)[:, None, :]


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x ``[T, heads, head_dim]`` rotated in the rotate-half layout."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def deinterleave(x: torch.Tensor) -> torch.Tensor:
    """``x [..., D]`` with rotary pairs at (2i, 2i + 1) -> the even dimensions, then the odd (a copy)."""
    return torch.cat((x[..., 0::2], x[..., 1::2]), dim=-1)
