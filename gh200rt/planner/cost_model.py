"""Cost model v1: sizes from ArchConfig and a per-layer decode-step time prediction.

Contract: all sizes in bytes, bandwidths in GB/s (1e9 bytes/s), times in seconds. Per layer:
compute = max(weight bytes / HBM bandwidth, 2 x params x batch / peak FLOPs) (a roofline at the
expected batch); a streamed layer's copy = bytes / link bandwidth and hides behind the compute of
the layers between prefetch and use; a direct layer reads its weights at the direct-read bandwidth.
"""
from __future__ import annotations

from dataclasses import dataclass

from gh200rt.models.arch_config import ArchConfig
from gh200rt.platform.detect import Platform

DTYPE_BYTES = {"fp32": 4, "float32": 4, "bf16": 2, "bfloat16": 2, "fp16": 2, "float16": 2}


@dataclass(frozen=True)
class ModelSizes:
    layer_params: int
    layer_bytes: int
    embed_bytes: int       # embedding + lm_head (counted once if tied)
    kv_bytes_per_token: int  # all layers, K and V
    num_layers: int


def model_sizes(arch: ArchConfig, dtype: str = "bf16", kv_dtype: str | None = None) -> ModelSizes:
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"--dtype {dtype!r}: choose one of {', '.join(DTYPE_BYTES)}")
    wb, kvb = DTYPE_BYTES[dtype], DTYPE_BYTES[kv_dtype or dtype]
    h, i = arch.hidden_size, arch.intermediate_size
    q, kv = arch.num_heads * arch.head_dim, arch.num_kv_heads * arch.head_dim
    params = h * q + 2 * h * kv + q * h + 3 * h * i + 2 * h  # q,k,v,o + gate,up,down + 2 norms
    embeds = arch.vocab_size * h * (1 if arch.tie_word_embeddings else 2) + h
    return ModelSizes(params, params * wb, embeds * wb, 2 * kv * kvb * arch.num_layers, arch.num_layers)


def layer_compute_seconds(sizes: ModelSizes, platform: Platform, batch: int) -> float:
    memory_s = sizes.layer_bytes / (platform.hbm_gbps * 1e9)
    flops_s = 2.0 * sizes.layer_params * batch / (platform.peak_tflops * 1e12)
    return max(memory_s, flops_s)


def copy_seconds(nbytes: int, platform: Platform) -> float:
    return nbytes / (platform.link_h2d_gbps * 1e9)


def direct_read_seconds(nbytes: int, platform: Platform) -> float:
    return nbytes / (platform.direct_read_gbps * 1e9)


def predict_step_seconds(tiers: list[str], sizes: ModelSizes, platform: Platform, batch: int,
                         prefetch_distance: int = 1) -> float:
    """Decode step time: each streamed copy overlaps the compute of the ``prefetch_distance``
    layers before its use; the copy engine serialises copies, so the step is bounded below by
    the total copy time too."""
    compute = layer_compute_seconds(sizes, platform, batch)
    per_layer = []
    for tier in tiers:
        per_layer.append(direct_read_seconds(sizes.layer_bytes, platform) if tier == "direct" else compute)
    total = sum(per_layer)
    stall = 0.0
    for idx, tier in enumerate(tiers):
        if tier == "streamed":
            hidden = sum(per_layer[max(0, idx - prefetch_distance):idx]) or 0.0
            stall += max(0.0, copy_seconds(sizes.layer_bytes, platform) - hidden)
    copies = sum(copy_seconds(sizes.layer_bytes, platform) for t in tiers if t == "streamed")
    head = sizes.embed_bytes / 2 / (platform.hbm_gbps * 1e9)  # lm_head read each step
    return max(total + stall, copies) + head
