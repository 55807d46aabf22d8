"""The placement the planner picks for one device budget, and what it needs of that budget.

Contract: ``planning_sizes`` adjusts a model's sizes once for the options (arena runs, dynamic tiers);
``layout_for(sizes, platform, memory, capacity, ...)`` is the one place that decides per-layer tiers, the
staging ring and the least KV cache for ``capacity``, and ``Layout.fits(capacity)`` is the one acceptance test:
``make_plan`` accepts exactly the budgets it accepts, and a refusal's minimum is searched with it
(``planner/budget.py``), so the two cannot disagree. Pure arithmetic: no tensors, no hardware.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from gh200rt.config import MemoryConfig
from gh200rt.planner.cost_model import ModelSizes, direct_staging_min_tokens, streaming_is_cheap
from gh200rt.platform.detect import Platform
from gh200rt.weights.tiers import Tier

DEFAULT_STAGING_SLOTS = 2


@dataclass(frozen=True)
class Layout:
    tiers: tuple[Tier, ...]
    staging_slots: int
    prefetch_distance: int
    direct_staging_tokens: int | None   # steps this long stage DIRECT layers through the ring
    dynamic: bool
    weight_bytes: int                   # fixed weights + resident layers (route forms included) + staging ring
    activation_bytes: int
    kv_min_blocks: int                  # the least KV cache: one max_model_len sequence, --kv-cache-min-tokens
    block_bytes: int                    # one KV block, all layers

    @property
    def kv_min_bytes(self) -> int:
        return self.kv_min_blocks * self.block_bytes

    @property
    def device_bytes(self) -> int:
        """The least device memory this layout runs in."""
        return self.weight_bytes + self.activation_bytes + self.kv_min_bytes

    def fits(self, capacity: int) -> bool:
        return self.device_bytes <= capacity

    def kv_blocks(self, capacity: int) -> int:
        """KV blocks ``capacity`` leaves beside the weights and activations."""
        return max(0, (capacity - self.weight_bytes - self.activation_bytes) // self.block_bytes)

    def describe(self) -> str:
        counts = ", ".join(f"{self.tiers.count(tier)} {tier}" for tier in Tier if tier in self.tiers)
        ring = f"K={self.staging_slots} staging slots" if self.staging_slots else "no staging ring"
        return f"{counts}, {ring}"


def spread_evenly(num_layers: int, count: int) -> list[int]:
    return sorted({min(num_layers - 1, int((j + 0.5) * num_layers / count)) for j in range(count)})


def fewest_streamed(sizes: ModelSizes, budget_for_weights: int, slots: int, ring_always: bool) -> list[Tier]:
    """The fewest streamed layers, spread evenly, whose resident rest (plus the ring) fits the budget."""
    n = sizes.num_layers
    for count in range(n + 1):
        staging = (slots if ring_always else min(slots, count)) * sizes.host_layer_bytes
        if sizes.fixed_memory + (n - count) * sizes.resident_layer_memory + staging <= budget_for_weights:
            tiers = [Tier.RESIDENT] * n
            for i in spread_evenly(n, count) if count else []:
                tiers[i] = Tier.STREAMED
            return tiers
    return [Tier.STREAMED] * n


def is_dynamic(memory: MemoryConfig, platform: Platform) -> bool:
    return memory.offload == "dynamic" or (memory.offload == "auto" and streaming_is_cheap(platform))


def planning_sizes(sizes: ModelSizes, memory: MemoryConfig, platform: Platform, block_size: int) -> ModelSizes:
    """``sizes`` as the device holds them: a resident layer takes whole KV blocks of the arena, and with dynamic
    tiers every layer's route forms are booked up front (any layer may be promoted later)."""
    block_bytes = sizes.kv_bytes_per_token * block_size
    sizes = dataclasses.replace(sizes, layer_run_bytes=max(1, -(-sizes.layer_bytes // block_bytes)) * block_bytes)
    if is_dynamic(memory, platform):
        sizes = dataclasses.replace(sizes, layer_form_bytes=0,
                                    head_form_bytes=sizes.head_form_bytes + sizes.num_layers * sizes.layer_form_bytes)
    return sizes


def _tiers_for(memory: MemoryConfig, sizes: ModelSizes, budget_for_weights: int, dynamic: bool) -> list[Tier]:
    n = sizes.num_layers
    if memory.offload == "none":
        return [Tier.RESIDENT] * n
    if memory.offload == "stream":
        return [Tier.STREAMED] * n
    if memory.offload == "direct":
        return [Tier.DIRECT] * n
    return fewest_streamed(sizes, budget_for_weights, memory.staging_slots or DEFAULT_STAGING_SLOTS, dynamic)


def layout_for(sizes: ModelSizes, platform: Platform, memory: MemoryConfig, capacity: int, block_size: int,
               activation_bytes: int, kv_min_tokens: int) -> Layout:
    """The placement for ``capacity`` (``sizes`` from ``planning_sizes``), whether or not it fits."""
    block_bytes = sizes.kv_bytes_per_token * block_size
    kv_min_blocks = max(-(-kv_min_tokens // block_size), 1)
    dynamic = is_dynamic(memory, platform)
    tiers = _tiers_for(memory, sizes, capacity - kv_min_blocks * block_bytes - activation_bytes, dynamic)
    for layer, tier in memory.tier_overrides.items():
        if layer >= sizes.num_layers:
            raise ValueError(f"--layer-tiers names layer {layer} but the model has {sizes.num_layers} layers "
                             f"(0-{sizes.num_layers - 1})")
        tiers[layer] = Tier(tier)
    staging_tokens = direct_staging_min_tokens(platform) if Tier.DIRECT in tiers else None
    ring_users = tiers.count(Tier.STREAMED) + (tiers.count(Tier.DIRECT) if staging_tokens else 0)
    slots = min(memory.staging_slots or DEFAULT_STAGING_SLOTS, ring_users) if ring_users else 0
    if dynamic:                         # any layer may start streaming: the ring is booked up front
        slots = memory.staging_slots or DEFAULT_STAGING_SLOTS
    distance = memory.prefetch_distance if memory.prefetch_distance is not None else max(0, slots - 1)
    weights = sizes.fixed_memory + tiers.count(Tier.RESIDENT) * sizes.resident_layer_memory + \
        slots * sizes.host_layer_bytes
    return Layout(tuple(tiers), slots, distance, staging_tokens, dynamic, weights, activation_bytes, kv_min_blocks,
                  block_bytes)
