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
EXPERT_STAGING_SLOTS = 2   # weights/expert_staging.py's ring
EXPERT_TIER_NAMES = {"resident": Tier.RESIDENT, "direct": Tier.DIRECT, "stream": Tier.STREAMED, "cpu": Tier.CPU}


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
    expert_tiers: tuple[tuple[Tier, ...], ...] = ()   # per layer: a tier per routed expert (() for a dense layer)
    direct_scales_on_device: bool = False   # DIRECT layers' scales in device memory (in weight_bytes)
    slot_bytes: int = 0                 # one staging slot: the largest layer that may use the ring

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
        experts = [t for layer in self.expert_tiers for t in layer]
        if experts:
            ring += "; routed experts " + ", ".join(f"{experts.count(tier)} {tier}" for tier in Tier if tier in experts)
        return f"{counts}, {ring}"


def expert_device_bytes(sizes: ModelSizes, expert_tiers, platform: Platform | None = None) -> int:
    """Device bytes of a placement's routed experts: the resident ones, and the expert ring when any streams (a
    cpu-tier expert streams in a step that routes more tokens to it than the host should compute, where
    offloaded experts stream)."""
    return sum(t == Tier.RESIDENT for layer in expert_tiers for t in layer) * sizes.resident_expert_memory + \
        (EXPERT_STAGING_SLOTS * sizes.host_expert_bytes if expert_ring_needed(expert_tiers, platform) else 0)


def expert_ring_needed(expert_tiers, platform: Platform | None) -> bool:
    flat = {t for layer in expert_tiers for t in layer}
    return Tier.STREAMED in flat or (Tier.CPU in flat and platform is not None
                                     and cpu_expert_fallback(platform) == Tier.STREAMED)


def cpu_expert_fallback(platform: Platform) -> Tier:
    """How a cpu-tier expert is read in a step that computes it on the device: as offloaded experts are."""
    return offloaded_expert_tier(platform)


def expert_tiers_for(sizes: ModelSizes, memory: MemoryConfig, platform: Platform,
                     budget_for_weights: int, layer_ring_bytes: int = 0) -> tuple[tuple[Tier, ...], ...]:
    """A tier per routed expert of every MoE layer (``--moe-expert-tier``; auto follows an explicit --offload
    none/stream/direct, else decides from the budget beside every layer resident: all experts resident while
    they fit, else as many of each layer's experts resident as fit (the lowest ids) and the rest read in place,
    or streamed where the host link is slow next to HBM (a PCIe GPU)). --layer-tiers L:experts=TIER overrides
    a layer; --n-cpu-moe N puts the experts of the MoE layers among the first N on the cpu tier. ``layer_ring_bytes``:
    the layers' staging ring when it is booked up front."""
    e, mode, moe_layers = sizes.num_experts, memory.expert_tier, list(sizes.moe_layer_ids)
    budget_for_weights -= layer_ring_bytes     # a ring booked whatever the tiers (dynamic tiers)
    if mode == "auto" and memory.offload in ("none", "stream", "direct"):
        mode = {"none": "resident", "stream": "stream", "direct": "direct"}[memory.offload]
    if mode != "auto":
        per_layer = [EXPERT_TIER_NAMES[mode]] * e
    else:
        offloaded = offloaded_expert_tier(platform)
        ring = EXPERT_STAGING_SLOTS * sizes.host_expert_bytes if offloaded == Tier.STREAMED else 0
        left = budget_for_weights - sizes.fixed_memory - sizes.resident_memory()
        if left >= sizes.all_experts * sizes.resident_expert_memory:
            resident = e
        else:
            resident = max(0, min(e - 1, (left - ring) // max(1, len(moe_layers) * sizes.resident_expert_memory)))
        per_layer = [Tier.RESIDENT] * resident + [offloaded] * (e - resident)
    overrides = memory.expert_tier_overrides
    for layer in overrides:
        if layer not in moe_layers:
            raise ValueError(f"--layer-tiers {layer}:experts=...: layer {layer} has no routed experts (the MoE "
                             f"layers are {_ranges(moe_layers)})")
    cpu_layers = set(range(memory.n_cpu_moe or 0))
    out: list[tuple[Tier, ...]] = [()] * sizes.num_layers
    for layer in moe_layers:
        out[layer] = (Tier(overrides[layer]),) * e if layer in overrides else \
            (Tier.CPU,) * e if layer in cpu_layers else tuple(per_layer)
    return tuple(out)


def offloaded_expert_tier(platform: Platform) -> Tier:
    """Where an expert off the device goes: read in place where the link is fast next to HBM (GH200; the CPU,
    where nothing crosses a link), else copied in when routed to (a PCIe GPU: read once, then from HBM)."""
    return Tier.DIRECT if platform.kind == "cpu" or streaming_is_cheap(platform) else Tier.STREAMED


def _ranges(layers: list[int]) -> str:
    return ", ".join(str(i) for i in layers[:8]) + (", ..." if len(layers) > 8 else "") if layers else "none"


def spread_evenly(num_layers: int, count: int) -> list[int]:
    return sorted({min(num_layers - 1, int((j + 0.5) * num_layers / count)) for j in range(count)})


def fewest_streamed(sizes: ModelSizes, budget_for_weights: int, slots: int, ring_always: bool) -> list[Tier]:
    """The fewest streamed layers, spread evenly, whose resident rest (plus the ring) fits the budget.
    ``ring_always``: the ring is booked whatever streams (dynamic tiers), its slots for the largest layer."""
    n = sizes.num_layers
    for count in range(n + 1):
        streamed = spread_evenly(n, count) if count else []
        staging = slots * sizes.host_layer_bytes if ring_always else \
            min(slots, count) * sizes.slot_bytes(streamed)
        kept = [i for i in range(n) if i not in streamed]
        if sizes.fixed_memory + sizes.resident_memory(kept) + staging <= budget_for_weights:
            return [Tier.STREAMED if i in streamed else Tier.RESIDENT for i in range(n)]
    return [Tier.STREAMED] * n


def is_dynamic(memory: MemoryConfig, platform: Platform) -> bool:
    return memory.offload == "dynamic" or (memory.offload == "auto" and streaming_is_cheap(platform))


def planning_sizes(sizes: ModelSizes, memory: MemoryConfig, platform: Platform, block_size: int) -> ModelSizes:
    """``sizes`` as the device holds them: a resident layer takes whole KV blocks of the arena, and with dynamic
    tiers every layer's route forms are booked up front (any layer may be promoted later)."""
    block_bytes = sizes.kv_bytes_per_token * block_size
    sizes = sizes.map_layers(lambda layer: dataclasses.replace(
        layer, run_bytes=max(1, -(-layer.resident_bytes // block_bytes)) * block_bytes))
    if is_dynamic(memory, platform):
        forms = sum(layer.form_bytes for layer in sizes.layers)
        sizes = dataclasses.replace(sizes.map_layers(lambda layer: dataclasses.replace(layer, form_bytes=0)),
                                    head_form_bytes=sizes.head_form_bytes + forms)
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
    """The placement for ``capacity`` (``sizes`` from ``planning_sizes``), whether or not it fits. An MoE
    model's routed experts are placed first: a step reads only the ones it routes to."""
    block_bytes = sizes.kv_bytes_per_token * block_size
    kv_min_blocks = max(-(-kv_min_tokens // block_size), 1)
    dynamic = is_dynamic(memory, platform)
    budget = capacity - kv_min_blocks * block_bytes - activation_bytes
    layer_ring = (memory.staging_slots or DEFAULT_STAGING_SLOTS) * sizes.host_layer_bytes if dynamic else 0
    if memory.asks_cpu_experts() and not sizes.moe_layer_ids:
        raise ValueError("--cpu-moe / --n-cpu-moe / --moe-expert-tier cpu place an MoE model's routed experts, and "
                         "this model has none (a dense model): drop the option, or offload its layers with --offload")
    expert_tiers = expert_tiers_for(sizes, memory, platform, budget, layer_ring) if sizes.moe_layer_ids else ()
    experts = expert_device_bytes(sizes, expert_tiers, platform)
    tiers = _tiers_for(memory, sizes, budget - experts, dynamic)
    for layer, tier in memory.tier_overrides.items():
        if layer >= sizes.num_layers:
            raise ValueError(f"--layer-tiers names layer {layer} but the model has {sizes.num_layers} layers "
                             f"(0-{sizes.num_layers - 1})")
        tiers[layer] = Tier(tier)
    staging_tokens = direct_staging_min_tokens(platform) if Tier.DIRECT in tiers else None
    ring_users = tiers.count(Tier.STREAMED) + (tiers.count(Tier.DIRECT) if staging_tokens else 0)
    slots = min(memory.staging_slots or DEFAULT_STAGING_SLOTS, ring_users) if ring_users else 0
    users = [i for i, t in enumerate(tiers) if t == Tier.STREAMED or (staging_tokens and t == Tier.DIRECT)]
    if dynamic:                         # any layer may start streaming: the ring is booked up front
        slots, users = memory.staging_slots or DEFAULT_STAGING_SLOTS, range(len(tiers))
    slot_bytes = sizes.slot_bytes(users) if slots else 0
    distance = memory.prefetch_distance if memory.prefetch_distance is not None else max(0, slots - 1)
    scales_on_device = direct_scales_on_device(memory, platform, sizes)
    direct = [i for i, t in enumerate(tiers) if t == Tier.DIRECT]
    weights = sizes.fixed_memory + sizes.resident_memory(i for i, t in enumerate(tiers) if t == Tier.RESIDENT) + \
        slots * slot_bytes + experts + \
        (sum(sizes.layers[i].host_scale_bytes for i in direct) if scales_on_device else 0)
    return Layout(tuple(tiers), slots, distance, staging_tokens, dynamic, weights, activation_bytes, kv_min_blocks,
                  block_bytes, expert_tiers, scales_on_device, slot_bytes)


def direct_scales_on_device(memory: MemoryConfig, platform: Platform, sizes: ModelSizes) -> bool:
    """Whether DIRECT layers keep their quantized weights' scales in device memory (``--direct-scales``): on a GPU
    platform, for a host format that has scales. On the CPU the device is host memory: nothing to move."""
    return memory.direct_scales == "device" and platform.kind != "cpu" and sizes.host_scale_bytes > 0
