"""Planner v1: choose per-layer tiers, staging depth K, prefetch distance d and KV blocks.

Contract: ``make_plan(sizes, platform, memory, capacity, block_size, batch, activation_bytes)`` returns
a ``Plan`` whose device bytes (embeddings + resident layers + K staging slots + activations + KV) fit
``capacity``, or raises ``PlanDoesNotFit`` naming the minimum budget that would work. The placement and its
acceptance are ``planner/layout.py``'s, the minimum ``planner/budget.py``'s search over them. Streamed layers
are spread evenly so each copy hides behind resident layers' compute. Embeddings/lm_head stay resident.
A staging slot holds one layer in the host format (``sizes.host_layer_bytes``).
"""
from __future__ import annotations

from dataclasses import dataclass

from gh200rt.config import MemoryConfig
from gh200rt.models.arch_config import ArchConfig
from gh200rt.planner.budget import PlanDoesNotFit, budget_refusal
from gh200rt.planner.cost_model import (ModelSizes, cpu_expert_max_tokens, cpu_expert_seconds, device_expert_seconds,
                                        predict_step_seconds)
from gh200rt.planner.layout import (EXPERT_STAGING_SLOTS, expert_device_bytes, expert_ring_needed, fewest_streamed,
                                    layout_for, planning_sizes, spread_evenly)
from gh200rt.platform.detect import Platform
from gh200rt.weights.tiers import Tier, slot_of

__all__ = ["Plan", "PlanDoesNotFit", "dynamic_splits", "make_plan", "spread_evenly"]

@dataclass(frozen=True)
class RankShare:
    """What one of ``world_size`` tensor-parallel ranks holds: the plan's sizes are that rank's (its heads, KV heads,
    MLP columns and 1/N of the vocabulary), and every rank follows the same plan."""
    world_size: int
    kv_heads: int            # KV heads each rank holds
    model_kv_heads: int

    latent_width: int = 0    # latent attention: the values of the latent KV row every rank holds whole

    @classmethod
    def of(cls, arch: ArchConfig, world_size: int) -> "RankShare":
        """``arch``: the whole model's."""
        return cls(world_size, max(1, arch.num_kv_heads // world_size), arch.num_kv_heads,
                   arch.kv_cache_dim if arch.is_mla else 0)

    def describe(self) -> str:
        kv = (f"{self.kv_heads} of the model's {self.model_kv_heads} KV heads (split)"
              if self.model_kv_heads >= self.world_size else
              f"{self.kv_heads} of the model's {self.model_kv_heads} KV heads (replicated on "
              f"{self.world_size // self.model_kv_heads} ranks)")
        if self.latent_width:
            kv = (f"{self.kv_heads} of the model's {self.model_kv_heads} attention heads and the whole latent KV row "
                  f"({self.latent_width} values a token and layer, the same on every rank)")
        return (f"tensor parallel: {self.world_size} ranks, one plan for all; each rank holds 1/{self.world_size} of "
                f"every layer's linears and of the embedding and LM head (vocab-parallel), norms (and MoE routers"
                f"{', latent attention q_a / kv_a projections' if self.latent_width else ''}) whole, {kv}; every "
                f"figure below is one rank's")


@dataclass(frozen=True)
class Plan:
    tiers: tuple[Tier, ...]
    staging_slots: int
    prefetch_distance: int
    num_kv_blocks: int
    block_size: int
    sizes: ModelSizes
    capacity: int
    platform: Platform
    predicted_step_seconds: float
    activation_bytes: int = 0
    direct_staging_tokens: int | None = None   # steps this long stage DIRECT layers through the ring
    arena_weight_blocks: int = 0               # blocks of the device arena the resident layers hold at start-up
    dynamic: bool = False                      # tiers follow KV demand at run time (--offload dynamic)
    expert_tiers: tuple[tuple[Tier, ...], ...] = ()   # per layer, a tier per routed expert (() for a dense layer)
    rank_share: RankShare | None = None        # a tensor-parallel rank's plan (sizes are per rank)
    direct_scales_on_device: bool = False      # DIRECT layers' scales in device memory (--direct-scales device)
    slot_bytes: int = 0                        # one staging slot (the largest layer that may use the ring)
    # the most pairs a step may route to a cpu-tier expert for the host's cores to compute it (None: no limit)
    cpu_expert_max_tokens: int | None = None

    def expert_counts(self, layer: int) -> dict[str, int]:
        tiers = self.expert_tiers[layer] if self.expert_tiers else ()
        return {tier.value: tiers.count(tier) for tier in Tier}

    @property
    def _flat_experts(self) -> list[Tier]:
        return [t for layer in self.expert_tiers for t in layer]

    @property
    def offloaded_layers(self) -> list[int]:
        return [i for i, t in enumerate(self.tiers) if t != Tier.RESIDENT]

    @property
    def direct_layers(self) -> list[int]:
        return [i for i, t in enumerate(self.tiers) if t == Tier.DIRECT]

    @property
    def streamed_layers(self) -> list[int]:
        return [i for i, t in enumerate(self.tiers) if t == Tier.STREAMED]

    @property
    def resident_layers(self) -> list[int]:
        return [i for i, t in enumerate(self.tiers) if t == Tier.RESIDENT]

    @property
    def resident_weight_bytes(self) -> int:
        return self.sizes.fixed_memory + self.sizes.resident_memory(self.resident_layers) + \
            self._flat_experts.count(Tier.RESIDENT) * self.sizes.resident_expert_memory

    @property
    def direct_scale_bytes(self) -> int:
        """Device bytes the DIRECT layers' scales take (0 unless ``direct_scales_on_device``)."""
        if not self.direct_scales_on_device:
            return 0
        return sum(self.sizes.layers[i].host_scale_bytes for i in self.direct_layers)

    @property
    def expert_staging_bytes(self) -> int:
        return EXPERT_STAGING_SLOTS * self.sizes.host_expert_bytes \
            if expert_ring_needed(self.expert_tiers, self.platform) else 0

    @property
    def layer_staging_bytes(self) -> int:
        return self.staging_slots * self.slot_bytes

    @property
    def staging_bytes(self) -> int:
        return self.layer_staging_bytes + self.expert_staging_bytes

    @property
    def host_weight_bytes(self) -> int:
        """Host slabs: the offloaded layers', or every layer's when tiers move at run time; an MoE layer's expert
        slab (all its experts) when any of them is not resident, or always when tiers move."""
        on_host = range(len(self.tiers)) if self.dynamic else self.offloaded_layers
        expert_slabs = sum(1 for layer in self.expert_tiers
                           if layer and (self.dynamic or any(t != Tier.RESIDENT for t in layer)))
        return self.sizes.host_bytes(on_host) + expert_slabs * self.sizes.num_experts * self.sizes.host_expert_bytes

    @property
    def tier_counts(self) -> dict[str, int]:
        return {tier.value: self.tiers.count(tier) for tier in Tier if tier != Tier.CPU}   # cpu: experts only

    @property
    def kv_tokens(self) -> int:
        return self.num_kv_blocks * self.block_size

    @property
    def kv_bytes(self) -> int:
        return self.kv_tokens * self.sizes.kv_bytes_per_token

    @property
    def all_resident_kv_tokens(self) -> int:
        """KV tokens the same budget would hold with every layer resident (0: the weights alone do not fit)."""
        free = self.capacity - self.sizes.all_resident_bytes - self.activation_bytes
        return max(0, free // (self.sizes.kv_bytes_per_token * self.block_size)) * self.block_size

    def slot_of(self, layer: int) -> int | None:
        streamed = self.streamed_layers
        return slot_of(streamed.index(layer), self.staging_slots) if layer in streamed else None

    def rank_bytes(self) -> str:
        """One rank's bytes, and all ranks' together (a tensor-parallel plan)."""
        n, sizes = self.rank_share.world_size, self.sizes
        gib = lambda b: f"{b / (1 << 30):.3f} GiB"  # noqa: E731
        layers = sum(sizes.layers[i].resident_bytes for i in self.resident_layers)
        host = self.host_weight_bytes
        return (f"per rank: layers {gib(layers)} on the device + {gib(host)} in host slabs, embeddings, LM head "
                f"and norms {gib(sizes.fixed_bytes)} (LM head {gib(sizes.head_bytes)}), KV cache {gib(self.kv_bytes)}; "
                f"all {n} ranks: device weights {gib(n * (layers + sizes.fixed_bytes))}, host slabs {gib(n * host)}, "
                f"KV cache {gib(n * self.kv_bytes)}")

    def figures(self) -> str:
        """The bandwidths and peak the cost model used, and where they came from."""
        p = self.platform
        cores = f", host cores reading cpu-tier experts {p.host_cpu_gbps:g} GB/s and computing {p.host_cpu_tflops:g} " \
            f"TFLOP/s" if Tier.CPU in self._flat_experts else ""
        return (f"cost model: host->device {p.link_h2d_gbps:g} GB/s, direct read {p.direct_read_gbps:g} GB/s, "
                f"HBM {p.hbm_gbps:g} GB/s, {p.peak_tflops:g} TFLOP/s{cores}; from {p.figures_from}")

    def cpu_tier_line(self) -> str:
        """Where a step computes a cpu-tier expert, by the pairs it routes to it, and the times that decide it."""
        sizes, p, limit = self.sizes, self.platform, self.cpu_expert_max_tokens
        ms = lambda seconds: f"{seconds * 1e3:.3f} ms"  # noqa: E731
        where = "on the host's cores whatever the pairs (the CPU platform: they are the device)" if limit is None \
            else f"on the host's cores in steps routing at most {limit} pairs to it, else on the device" if limit \
            else "on the device (the cores are slower even for one pair: the tier only keeps it in host memory)"
        return (f"cpu-tier experts: computed {where}; one expert takes "
                f"{ms(cpu_expert_seconds(sizes, p, 1))} on the cores for one pair, "
                f"{ms(cpu_expert_seconds(sizes, p, 64))} for 64, {ms(device_expert_seconds(sizes, p))} on the device "
                f"(--moe-cpu-max-tokens sets the limit)")

    def kinds_line(self) -> str:
        """A model that mixes dense and MoE layers: each kind's size, planned as its own."""
        gib = lambda n: f"{n / (1 << 30):.3f} GiB"  # noqa: E731
        what = {"dense": "attention and dense MLP", "moe": "attention, router and shared expert; routed experts apart"}
        kinds = [f"{sum(layer.kind == kind for layer in self.sizes.layers)} {kind} ({what[kind]}: "
                 f"{gib(sizes.resident_bytes)} resident, {gib(sizes.host_bytes)} in host form)"
                 for kind, sizes in self.sizes.kinds.items()]
        return "layer kinds, each planned at its own size: " + "; ".join(kinds)

    def explain(self) -> str:
        gib = lambda n: f"{n / (1 << 30):9.3f} GiB"  # noqa: E731
        counts = ", ".join(f"{n} {tier}" for tier, n in self.tier_counts.items() if n)
        lines = [f"plan for {self.platform.profile} ({self.platform.kind}), device budget {gib(self.capacity)}: "
                 f"{counts}" + (" at start-up; tiers follow KV demand (--offload dynamic)" if self.dynamic else ""),
                 *([self.rank_share.describe(), self.rank_bytes()] if self.rank_share else []),
                 self.figures(),
                 *([self.kinds_line()] if len(self.sizes.kinds) > 1 else []),
                 f"{'layer':>5} {'tier':<9} {'bytes':>13} {'slot':>4}"
                 + (f"  routed experts (resident/direct/streamed/cpu of {self.sizes.num_experts})"
                    if self.expert_tiers else "")]
        for i, tier in enumerate(self.tiers):
            slot = self.slot_of(i)
            layer = self.sizes.layers[i]
            nbytes = layer.resident_bytes if tier == Tier.RESIDENT else layer.host_bytes
            experts = ""
            if self.expert_tiers and self.expert_tiers[i]:
                n = self.expert_counts(i)
                experts = f"  {n['resident']}/{n['direct']}/{n['streamed']}/{n['cpu']}"
            lines.append(f"{i:>5} {tier:<9} {gib(nbytes)} {'-' if slot is None else slot:>4}{experts}")
        if self.expert_tiers:
            flat = self._flat_experts
            lines.append(
                f"routed experts: {flat.count(Tier.RESIDENT)} resident ({gib(self.sizes.resident_expert_memory)} "
                f"each), {flat.count(Tier.DIRECT)} direct, {flat.count(Tier.STREAMED)} streamed, "
                f"{flat.count(Tier.CPU)} cpu; host form "
                f"{gib(self.sizes.host_expert_bytes)} each; a decode step of batch 1 touches {self.sizes.experts_per_tok} "
                f"of {self.sizes.num_experts} per layer, and a direct or streamed expert crosses the link only "
                f"when a token routes to it"
                + (", a cpu one is computed by the host's cores where it lives" if Tier.CPU in flat else "")
                + (f"; expert staging ring {gib(self.expert_staging_bytes)}" if self.expert_staging_bytes else ""))
            if Tier.CPU in flat:
                lines.append(self.cpu_tier_line())
        lines += [f"device memory for weights (resident layers and experts, embeddings, norms): "
                  f"{gib(self.resident_weight_bytes)}",
                  f"host memory for offloaded weights: {gib(self.host_weight_bytes)}",
                  f"staging ring: K={self.staging_slots} d={self.prefetch_distance} {gib(self.layer_staging_bytes)}",
                  *([f"direct layers' scales in device memory (--direct-scales device; only their codes cross the "
                     f"link): {gib(self.direct_scale_bytes)}"] if self.direct_scale_bytes else []),
                  *([f"direct layers are staged through the ring in steps of >= {self.direct_staging_tokens} "
                     f"tokens (host_gemm would read each weight over the link once per 64 rows)"]
                    if self.direct_staging_tokens and self.direct_layers else []),
                  f"activations (and decode graph pool): {gib(self.activation_bytes)}",
                  f"KV cache: {self.num_kv_blocks} blocks = {self.kv_tokens} tokens, {gib(self.kv_bytes)} at "
                  f"{self.sizes.kv_bytes_per_token} bytes per token "
                  f"(all layers resident would leave {self.all_resident_kv_tokens} tokens)",
                  *([f"device arena: {self.num_kv_blocks + self.arena_weight_blocks} blocks of "
                     f"{self.sizes.kv_bytes_per_token * self.block_size} bytes: {self.arena_weight_blocks} hold the "
                     f"resident layers' weights, {self.num_kv_blocks} the KV cache (moving a layer's tier moves "
                     f"its blocks between the two)"] if self.arena_weight_blocks else []),
                  f"predicted decode step (batch 1): {self.predicted_step_seconds * 1e3:.3f} ms"]
        return "\n".join(lines)


def make_plan(sizes: ModelSizes, platform: Platform, memory: MemoryConfig, capacity: int,
              block_size: int = 16, batch: int = 1, activation_bytes: int = 0, max_model_len: int = 0,
              rank_share: RankShare | None = None) -> Plan:
    """``max_model_len``: the KV cache must hold at least one sequence that long (and
    ``--kv-cache-min-tokens``); ``activation_bytes``: a step's working memory beside weights and KV (activations,
    and on a GPU the decode graphs' pool); ``rank_share``: a tensor-parallel rank's (``sizes`` and ``capacity``
    are that rank's)."""
    kv_min_tokens = max(memory.kv_cache_min_tokens or 0, max_model_len)
    planned = planning_sizes(sizes, memory, platform, block_size)
    layout = layout_for(planned, platform, memory, capacity, block_size, activation_bytes, kv_min_tokens)
    slots, distance = layout.staging_slots, layout.prefetch_distance
    if slots and distance >= slots:
        raise ValueError(f"--prefetch-distance {distance} must be less than the staging slots in use ({slots})")
    if not layout.fits(capacity):
        raise budget_refusal(sizes, platform, memory, capacity, block_size, activation_bytes, kv_min_tokens)
    step = predict_step_seconds(list(layout.tiers), planned, platform, batch, max(distance, 1),
                                layout.expert_tiers, layout.direct_scales_on_device)
    return Plan(layout.tiers, slots, distance, layout.kv_blocks(capacity), block_size, planned, capacity, platform,
                step, activation_bytes, layout.direct_staging_tokens, dynamic=layout.dynamic,
                expert_tiers=layout.expert_tiers, rank_share=rank_share,
                direct_scales_on_device=layout.direct_scales_on_device, slot_bytes=layout.slot_bytes,
                cpu_expert_max_tokens=memory.moe_cpu_max_tokens if memory.moe_cpu_max_tokens is not None
                else cpu_expert_max_tokens(planned, platform))


def dynamic_splits(plan: Plan, kv_tokens: list[int], batch: int = 1) -> list[dict]:
    """Where ``--offload dynamic`` settles for each KV demand: the fewest streamed layers (spread evenly)
    that leave ``kv_tokens`` of KV cache, with the decode step the cost model predicts for that split."""
    sizes, rows = plan.sizes, []
    experts = expert_device_bytes(sizes, plan.expert_tiers, plan.platform)   # experts keep their start-up tiers
    budget = plan.capacity - plan.activation_bytes - experts
    for tokens in kv_tokens:
        kv = -(-tokens // plan.block_size) * plan.block_size * sizes.kv_bytes_per_token
        tiers = fewest_streamed(sizes, budget - kv, plan.staging_slots, True)
        weights = sizes.fixed_memory + sizes.resident_memory(i for i, t in enumerate(tiers) if t == Tier.RESIDENT) \
            + plan.staging_slots * sizes.host_layer_bytes
        fits = weights + kv <= budget
        rows.append(dict(kv_tokens=tokens, fits=fits, streamed=tiers.count(Tier.STREAMED),
                         resident=tiers.count(Tier.RESIDENT),
                         step_seconds=predict_step_seconds(tiers, sizes, plan.platform, batch,
                                                           max(plan.prefetch_distance, 1), plan.expert_tiers,
                                                           plan.direct_scales_on_device)))
    return rows
