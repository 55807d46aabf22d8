"""What a test double of a model's architecture says of its KV pool, for the doubles of conventional attention: two
planes (K and V) of ``num_kv_heads`` heads of ``head_dim`` (``ArchConfig`` has the same three, kv/pool.py)."""
from __future__ import annotations


class HeadsKvLayout:
    kv_planes = 2

    @property
    def kv_cache_heads(self) -> int:
        return self.num_kv_heads

    @property
    def kv_cache_dim(self) -> int:
        return self.head_dim
