"""The three places a decoder layer's linear weights can live (a routed expert's: a fourth, ``cpu``), and the staging
ring's slot rule."""
from __future__ import annotations

import enum


class Tier(str, enum.Enum):
    RESIDENT = "resident"   # a device copy, for as long as the layer keeps this tier
    STREAMED = "streamed"   # a host slab, copied into a staging slot ahead of every use
    DIRECT = "direct"       # a host slab, read in place by the kernels (zero-copy)
    CPU = "cpu"             # a routed expert only: its host form, computed by the host's cores (expert_cpu.py)

    def __str__(self) -> str:
        return self.value

    __format__ = str.__format__


LAYER_TIERS = (Tier.RESIDENT, Tier.STREAMED, Tier.DIRECT)   # a decoder layer's own weights (cpu: experts only)


def slot_of(position: int, num_slots: int) -> int:
    """The staging slot of the layer at ``position`` of a step's ring order. Fixed for as long as the order
    is, so the slot views a layer's WeightRefs point at (and a captured graph reads) never move."""
    return position % num_slots
