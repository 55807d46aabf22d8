"""Streamed experts: copied into a small staging ring only in the steps whose tokens route to them.

A layer's router decides which experts run, so which streamed experts a step needs is known only inside the
layer. ``ExpertStaging`` is the ``ExpertAccess`` of one MoE layer: ``begin(active)`` takes the streamed experts
among the active ones as the ring's order (``StreamingSchedule``: a copy never overwrites a slot whose reader
has not run, each copy issued ``distance`` experts ahead) and points their WeightRefs at their slots;
``before(e)`` waits for e's copy, ``after(e)`` releases its slot and issues the next. Resident and direct
experts pass through untouched; cpu-tier experts (expert_cpu.py) are handed to the host's cores for the steps that
route few tokens to them (``host_experts``), and read as ``cpu_fallback`` says (direct or streamed) in the others.
All MoE layers share the one ring (``ExpertRing``): a layer drains it before the next begins, since layers run one
after another.
"""
from __future__ import annotations

import torch

from gh200rt.models.layers.moe_experts import ExpertAccess
from gh200rt.transfer.backend import make_transfer_backend
from gh200rt.weights.schedule import StreamingSchedule
from gh200rt.weights.tiers import Tier, slot_of

EXPERT_STAGING_SLOTS = 2


class ExpertRing:
    """The staging slots streamed experts are copied into (``slot_bytes``: the largest expert span)."""

    def __init__(self, device: torch.device, slot_bytes: int, poison: bool, num_slots: int = EXPERT_STAGING_SLOTS):
        self.backend = make_transfer_backend(device, slot_bytes, num_slots, poison)
        self.num_slots = num_slots
        self._layer: ExpertStaging | None = None
        self.schedule = StreamingSchedule(self.backend, num_slots - 1, self._source, self._rebind, wrap_steps=False)

    @property
    def nbytes(self) -> int:
        return sum(slot.nbytes for slot in self.backend.slots)

    def _source(self, expert: int) -> torch.Tensor:
        return self._layer.slab.source(expert)

    def _rebind(self, order: list[int]) -> None:
        if self._layer is not None:
            for position, expert in enumerate(order):
                self._layer.bind_slot(expert, slot_of(position, self.num_slots))

    def start(self, layer: "ExpertStaging", order: list[int]) -> None:
        self._layer = layer            # set_orders drains the previous layer's copies (all read by now) first
        self.schedule.set_orders(order)

    def close(self) -> None:
        self.schedule.drain()
        self.backend.close()


class ExpertStaging(ExpertAccess):
    """One MoE layer's access hooks; ``tiers`` is the store's list for the layer (read at every step); ``ring``
    is set once any expert streams. Counts the direct experts' reads (``direct_reads``: one per step that
    routes to one), which cross the link where host memory is not the device's."""

    def __init__(self, ring: ExpertRing | None, slab, tiers: list[Tier], write, compute_dtype: torch.dtype,
                 cpu_fallback: Tier = Tier.DIRECT):
        self.ring, self.slab, self.tiers, self._write = ring, slab, tiers, write
        self.compute_dtype = compute_dtype
        self.direct_reads = 0
        self._bound: dict[tuple[int, int], dict[str, object]] = {}   # (expert, slot) -> weights over the slot
        # the cpu tier: its experts' host forms, the pool and MLP that compute them, the per-step rule
        self.cpu_fallback = cpu_fallback
        self.host_weights: dict[int, dict[str, object]] = {}
        self.cpu_pool = None
        self.host_mlp = None
        self.cpu_max_tokens: int | None = None
        self.choose_host = None             # (expert, pairs) -> bool: replaces the max-tokens rule (tests)
        # cpu-tier experts' runs and (token, choice) pairs, by where they were computed: "cpu" or "device"
        self.cpu_tier_runs = {"cpu": 0, "device": 0}
        self.cpu_tier_pairs = {"cpu": 0, "device": 0}

    def bind_slot(self, expert: int, slot: int) -> None:
        weights = self._bound.get((expert, slot))
        if weights is None:
            weights = self._bound[(expert, slot)] = self.slab.bind(self.ring.backend.slots[slot],
                                                                   self.compute_dtype, stable=False)
        self._write(expert, weights)

    def stages_experts(self) -> bool:
        return Tier.STREAMED in self.tiers or Tier.CPU in self.tiers

    def device_tier(self, expert: int) -> Tier:
        """How expert ``expert`` is read when the device computes it."""
        tier = self.tiers[expert]
        return self.cpu_fallback if tier == Tier.CPU else tier

    def host_experts(self, counts: list[int]) -> list[int]:
        if not self.host_weights:
            return []
        host = []
        for e, n in enumerate(counts):
            if n and self.tiers[e] == Tier.CPU:
                on_host = self.choose_host(e, n) if self.choose_host is not None else \
                    self.cpu_max_tokens is None or n <= self.cpu_max_tokens
                where = "cpu" if on_host else "device"
                self.cpu_tier_runs[where] += 1
                self.cpu_tier_pairs[where] += n
                if on_host:
                    host.append(e)
        return host

    def start_host(self, rows: torch.Tensor, experts: list[int], counts: list[int], block_rows: int | None):
        return self.cpu_pool.submit(self.host_mlp, [self.host_weights[e] for e in experts], rows,
                                    [counts[e] for e in experts], block_rows)

    def begin(self, active: list[int]) -> None:
        self.direct_reads += sum(1 for e in active if self.device_tier(e) == Tier.DIRECT)
        if self.ring is not None:
            self.ring.start(self, [e for e in active if self.device_tier(e) == Tier.STREAMED])

    def before(self, expert: int) -> None:
        if self.ring is not None:
            self.ring.schedule.before_layer(expert)

    def after(self, expert: int) -> None:
        if self.ring is not None:
            self.ring.schedule.after_layer(expert)
