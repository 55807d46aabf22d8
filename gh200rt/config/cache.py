"""``CacheConfig``: the KV cache's blocks, element type and prefix caching."""
from __future__ import annotations

from dataclasses import dataclass, field

from gh200rt.config.flags import flag_help

KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2")  # vLLM's values; fp8 = fp8_e4m3


@dataclass(frozen=True)
class CacheConfig:
    block_size: int = field(default=16, metadata=flag_help("tokens per KV cache block"))
    num_kv_blocks: int | None = field(default=None, metadata=flag_help(
        "KV cache blocks; default: what the device memory budget leaves"))
    enable_prefix_caching: bool = field(default=True, metadata=flag_help("reuse KV blocks of shared prompt prefixes"))
    kv_cache_dtype: str = field(default="auto", metadata=flag_help(
        "KV cache element type: auto (the compute dtype), fp8 / fp8_e4m3 (e4m3 with a K and a V scale per layer; "
        "half of bf16), fp8_e5m2 (wider range, one mantissa bit less)", choices=KV_CACHE_DTYPES))
    calculate_kv_scales: bool = field(default=False, metadata=flag_help(
        "with an fp8 KV cache, set each layer's K and V scales from the first batch (its largest magnitude over "
        "the fp8 maximum); otherwise the checkpoint's k_scale / v_scale, or 1.0"))

    def __post_init__(self):
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"--kv-cache-dtype {self.kv_cache_dtype!r}: choose one of {', '.join(KV_CACHE_DTYPES)}")
        if self.calculate_kv_scales and self.kv_cache_dtype == "auto":
            raise ValueError("--calculate-kv-scales sets the scales of an fp8 KV cache; add --kv-cache-dtype fp8 "
                             "(or drop --calculate-kv-scales)")
        if self.block_size < 1 or self.block_size & (self.block_size - 1):
            raise ValueError(f"--block-size must be a power of two, got {self.block_size} (16 is the default)")
        if self.num_kv_blocks is not None and self.num_kv_blocks < 1:
            raise ValueError(f"--num-kv-blocks must be at least 1, got {self.num_kv_blocks}")
