"""``DraftBooking``: what a speculative draft takes of device memory beside the target, as the planner books it."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DraftBooking:
    """A draft's weights, and its KV bytes per pool block (its KV cache has the target pool's blocks, so each block
    costs both models'); zeros without a draft."""
    weight_bytes: int = 0
    kv_bytes_per_block: int = 0
