"""WeightStore: the one owner of where a model's decoder-layer weights live, and the only writer of
``WeightRef.current``.

``WeightStore(model, device, platform, host_format, ...)`` takes a model loaded on the host;
``apply(plan)`` places it, ``set_tier(layer, tier)`` moves one layer between steps, ``close()``
releases every slab.
- Parameters, buffers and the linear weights of RESIDENT layers live on ``device`` (on the CPU
  platform, converted into the CPU route's fastest form, ``cpu_linear_format``).
- An offloaded layer's linears take their host form (``forms.py``) in one ``LayerSlab`` on the
  platform's host NUMA node. A DIRECT layer's WeightRefs point at the slab as the device reads it in
  place; a STREAMED layer's at its staging slot, which ``StreamingSchedule`` fills ahead of use.
- When the plan says so (``direct_staging_tokens``, GPU platforms), steps that long also stage the
  direct layers through the ring.
- A layer promoted back to RESIDENT gets one device buffer holding its slab's bytes: it computes
  with exactly the bits it streamed. Its slab stays, so demoting it again is a rebind; with
  ``keep_host_copies`` every layer gets a slab at ``apply`` (dynamic tiers), otherwise a resident
  layer's slab is built from its device weights when it is first demoted.
- The store drives the ring: the model runner calls its ``begin_step`` / ``before_layer`` /
  ``after_layer`` hooks; with ``prefetch_across_steps`` the next step's first streamed layers copy
  during the tail of this one. Tier changes happen between steps only.
- Every device byte it places is booked in ``ledger`` (when given) under ``resident_weights`` and
  ``staging_ring``; a promotion that does not fit raises ``LedgerOverCommit`` before anything moves.
- An MoE layer's routed experts are placed one by one (``ExpertPlacement``, expert_placement.py); a layer's
  tier governs the rest of its linears (``_layer_refs``).
- With ``slab_cache`` (slab_cache.py), quantized slabs are read back from disk instead of quantized again.
- With ``deferred`` (loader/deferred_layers.py) a layer's dense linears stay in the checkpoint until the store needs
  them: a resident layer reads them in, a slab the cache does not hold is quantized from the file's memory map.

The store is assembled from one part per concept, each in its own module and sharing the store's state:
``ArenaRuns`` (arena_runs.py: resident layers in runs of the device arena), ``LayerStaging`` (layer_staging.py:
the staging ring, the refs bound to its slots, the model runner's hooks), ``SlabBuilding`` (slab_building.py: an
offloaded layer's host slab), ``ResidentForms`` (resident_forms.py: the CPU route's forms of resident linears,
what goes to the device) and ``ExpertPlacement``. This module places and moves the layers (``apply``,
``set_tier``), books the ledger and closes.
"""
from __future__ import annotations

import os

import torch

from gh200rt.backends.cpu.prepack import model_route_form_bytes
from gh200rt.models.layers.moe_experts import NO_EXPERT_ACCESS
from gh200rt.weights import forms as weight_forms
from gh200rt.weights.arena_runs import ArenaRuns, NoFreeRun  # noqa: F401  (NoFreeRun: users import it here)
from gh200rt.weights.expert_placement import ExpertPlacement
from gh200rt.weights.expert_slab import ExpertSlab
from gh200rt.weights.expert_staging import ExpertRing
from gh200rt.weights.layer_slab import LayerSlab, WeightLayout
from gh200rt.weights.layer_staging import LayerStaging
from gh200rt.weights.resident_forms import ResidentForms
from gh200rt.weights.schedule import NULL_HOOKS, LayerHooks, StreamingSchedule
from gh200rt.weights.slab_building import SlabBuilding
from gh200rt.weights.tiers import LAYER_TIERS, Tier

DEFAULT_STAGING_SLOTS = 2
QUANT_MAX_WORKERS = 16


class _ClosedWeight:
    """What an offloaded layer's WeightRef holds once its store was closed."""
    nbytes = 0

    def linear(self, x, bias=None):
        raise RuntimeError("this model's offloaded weights were released when its engine was closed; "
                           "build a new engine to generate again")


CLOSED_WEIGHT = _ClosedWeight()


class WeightStore(ExpertPlacement, ArenaRuns, LayerStaging, SlabBuilding, ResidentForms):
    def __init__(self, model, device="cpu", platform=None, host_format: str | None = None, poison: bool = False,
                 ledger=None, quantized: dict | None = None, cpu_linear_format: str | None = None,
                 keep_host_copies: bool = False, prefetch_across_steps: bool = True, slab_cache=None,
                 deferred=None, cpu_pool_factory=None, cpu_max_tokens: int | None = None):
        self.model, self.device, self.platform = model, torch.device(device), platform
        self.compute_dtype = model.dtype
        self.host_format = host_format or weight_forms.resolve_host_format(
            "auto", self.device.type == "cpu", self.compute_dtype, bool(quantized))
        self.poison, self.ledger, self.quantized = poison, ledger, quantized
        self.cpu_linear_format = cpu_linear_format if self.device.type == "cpu" else None
        self.keep_host_copies = keep_host_copies
        self.slab_cache = slab_cache     # weights/slab_cache.py: quantized slabs kept between runs, or None
        # loader/deferred_layers.py: layers whose dense linears are still in the checkpoint, read when needed
        self.deferred = deferred
        # threads that quantize host forms at load: the CPUs this process may use (the GPU's node once bound)
        self.quant_workers = min(QUANT_MAX_WORKERS, len(os.sched_getaffinity(0))) \
            if hasattr(os, "sched_getaffinity") else 1
        self.prefetch_across_steps = prefetch_across_steps
        self.tiers: list[Tier] = []
        self.slabs: dict[int, LayerSlab] = {}
        self._slot_weights: dict[tuple[int, int], tuple[LayerSlab, torch.Tensor, dict]] = {}  # (layer, slot)
        self.backend = None
        self.device_weight_bytes = 0
        self._layer_device_bytes: dict[int, int] = {}   # resident layer -> device bytes of its linears
        self._num_slots = DEFAULT_STAGING_SLOTS
        self._distance: int | None = None
        self._direct_staging_tokens: int | None = None
        self.direct_scales_on_device = False             # the plan's --direct-scales placement (a GPU only)
        self._direct_scale_bytes: dict[int, int] = {}    # DIRECT layer -> device bytes of its scales
        self._schedule: LayerHooks = NULL_HOOKS
        self._closed = False
        self.arena = None
        self._runs: dict[int, int] = {}                  # resident layer -> first block of its arena run
        self.plan_version = 0                            # +1 per placement change: captured graphs are stale
        # an MoE model's routed experts, each placed on its own (weights/expert_slab.py, expert_staging.py)
        self.expert_tiers: dict[int, list[Tier]] = {}    # MoE layer -> a tier per expert
        self.expert_slabs: dict[int, ExpertSlab] = {}
        # (layer, expert) -> (device bytes of its home, its route form's extra bytes) booked for it
        self._expert_booked: dict[tuple[int, int], tuple[int, int]] = {}
        self._expert_runs: dict[tuple[int, int], int] = {}   # resident expert -> first block of its arena run
        self.expert_ring: ExpertRing | None = None
        # the cpu expert tier (expert_cpu.py): its pool, made by ``cpu_pool_factory()`` when an expert first takes the
        # tier, and the most pairs a step may route to a cpu expert for the host to compute it (None: no limit)
        self.cpu_pool_factory, self.cpu_max_tokens = cpu_pool_factory, cpu_max_tokens
        self.cpu_expert_pool = None

    # ---- what the ledger and the engine read ------------------------------------------------------
    @property
    def staging_bytes(self) -> int:
        ring = sum(slot.nbytes for slot in self.backend.slots) if self.backend else 0
        return ring + (self.expert_ring.nbytes if self.expert_ring else 0)

    def host_slab_bytes(self) -> int:
        return sum(s.nbytes for s in self.slabs.values()) + sum(s.nbytes for s in self.expert_slabs.values())

    @property
    def tier_counts(self) -> dict[str, int]:
        return {tier.value: self.tiers.count(tier) for tier in Tier if tier != Tier.CPU}   # cpu: experts only

    def layers(self, tier: Tier) -> list[int]:
        return [i for i, t in enumerate(self.tiers) if t == tier]

    # ---- placing -----------------------------------------------------------------------------------
    def apply(self, plan, arena_factory=None) -> None:
        """Place the model per ``plan`` (the first call), or move every layer whose tier differs (later).

        ``arena_factory(run_bytes)``, called once the fixed weights and the staging ring are booked, returns
        the ``DeviceArena`` the resident layers (of ``run_bytes`` bytes each) then take runs of."""
        tiers = [Tier(t) for t in plan.tiers]
        if self.tiers:
            for layer, tier in enumerate(tiers):
                self.set_tier(layer, tier)
            return
        self.plan_version += 1
        self.platform = self.platform or plan.platform
        self._num_slots = plan.staging_slots or DEFAULT_STAGING_SLOTS
        self._distance = plan.prefetch_distance if plan.staging_slots else None
        self._direct_staging_tokens = plan.direct_staging_tokens
        self.direct_scales_on_device = getattr(plan, "direct_scales_on_device", False) and self.device.type != "cpu"
        self.tiers = tiers
        for layer, tier in enumerate(tiers):   # one layer at a time: its dense weights go once the slab holds them
            if tier == Tier.RESIDENT:
                self._load_deferred(layer)
            if tier != Tier.RESIDENT or self.keep_host_copies:
                self._build_slab(layer, self._layer_refs(layer))
            if tier != Tier.RESIDENT:
                self._write(layer, self.slabs[layer].bind(self.slabs[layer].tensor, self.compute_dtype, stable=True))
        self._place_experts([list(t) for t in getattr(plan, "expert_tiers", ())])
        if self.device.type != "cpu" and weight_forms.is_fp8_checkpoint(self.quantized):
            self._keep_fp8_resident()
        in_arena = arena_factory is not None
        placed = self._move_to_device(resident_layers=not in_arena)
        if not in_arena:
            for layer in self.layers(Tier.RESIDENT):
                self._write(layer, self._resident_forms({name: ref.current for name, ref in
                                                         self._layer_refs(layer).items()}, layer))
        # the CPU routes' extra forms (fp32 reordered copies, fp16+gguf blocks), booked before the arena takes
        # what is left: every layer's when dynamic tiers may promote any of them later
        copies = model_route_form_bytes(self.model, self.cpu_linear_format,
                                        range(len(tiers)) if plan.dynamic else self.layers(Tier.RESIDENT),
                                        parts_of=self._route_parts, refs_of=self._layer_refs)
        homes = [(layer, expert) for layer, tiers in self.expert_tiers.items() for expert, tier in enumerate(tiers)
                 if tier == Tier.RESIDENT]
        copies += sum(self._expert_form_bytes(layer, expert) for layer, expert in homes)
        lm_head = self.model.lm_head.weight_ref
        lm_head.current = self._resident_form(lm_head.current, None, "lm_head", torch.get_num_threads())
        self._book("resident_weights", placed)
        self._book("cpu_route_forms", copies)
        for layer in self.layers(Tier.DIRECT):       # booked before the arena takes what is left
            self._place_direct_scales(layer)
        # dynamic tiers book the ring up front for the largest layer: any layer may start streaming later
        ring_layers = list(self.slabs) if plan.dynamic else self._ring_users()
        if ring_layers:
            self._make_ring(max(self.slabs[i].nbytes for i in ring_layers))
        if in_arena:
            layouts = {layer: WeightLayout({name: ref.current for name, ref in
                                            self._layer_refs(layer).items()})
                       for layer in self.layers(Tier.RESIDENT)}
            expert_runs = [self.expert_slabs[layer].expert_nbytes for layer, _ in homes if layer in self.expert_slabs]
            self.arena = arena_factory([layout.nbytes for layout in layouts.values()] + expert_runs)
            for layer, layout in layouts.items():
                self._place_in_arena(layer, layout)
        for layer, expert in homes:                  # forms booked above, with the layers'
            self._home_expert(layer, expert, book_forms=False)
        if self.deferred is not None:    # every layer is placed: what was not read is served from its slab
            self.deferred.release()
        self._reorder()
        self._keep_promotion_room()

    def set_tier(self, layer: int, tier: Tier | str) -> None:
        """Move ``layer`` to ``tier``, between steps. A promotion that does not fit the ledger raises
        ``LedgerOverCommit`` and changes nothing."""
        self._move(layer, tier)
        self._keep_promotion_room()

    def _move(self, layer: int, tier: Tier | str) -> None:
        tier, old = Tier(tier), self.tiers[layer]
        if self._closed:
            raise RuntimeError("this weight store was closed with its engine; build a new engine")
        if tier not in LAYER_TIERS:
            raise ValueError(f"layer {layer}: a decoder layer's weights are {', '.join(LAYER_TIERS)}; the {tier} tier "
                             f"is a routed expert's (set_expert_tier)")
        if tier == old:
            return
        if tier == Tier.STREAMED and layer in self.slabs:
            self._check_fits_ring(layer)
        if tier == Tier.DIRECT:                  # booked first: a placement that does not fit changes nothing
            self._place_direct_scales(layer)
        elif old == Tier.DIRECT:
            self._drop_direct_scales(layer)
        self.plan_version += 1
        if tier == Tier.STREAMED and self.backend is None and self.arena is not None:
            raise ValueError(f"layer {layer} cannot stream: this engine started without a staging ring and the "
                             f"device arena holds the rest of device memory; start it with a streamed layer "
                             f"(--layer-tiers / --offload stream) so the ring is booked")
        if old == Tier.RESIDENT:
            if layer not in self.slabs:
                self._build_slab(layer, self._layer_refs(layer))
            if self.backend is None and tier == Tier.STREAMED:
                self._make_ring(self.slabs[layer].nbytes)
            if tier == Tier.STREAMED:
                self._check_fits_ring(layer)
            self.tiers[layer] = tier
            self._reorder()                      # the layer's refs now point at its slot or slab
            if self.arena is not None:
                self._return_run(layer)
            else:
                self._book("resident_weights", -self._layer_device_bytes.pop(layer))
            return
        if tier == Tier.RESIDENT and self.arena is not None:
            slab = self.slabs[layer]
            self._place_in_arena(layer, slab.layout, slab)
            self.tiers[layer] = tier
            self._reorder()
            return
        if tier == Tier.RESIDENT:
            slab = self.slabs[layer]
            self._book("resident_weights", slab.nbytes)
            try:
                home = slab.device_copy()
            except BaseException:
                self._book("resident_weights", -slab.nbytes)
                raise
            self.tiers[layer] = tier
            self._reorder()                      # out of the ring first: the refs written below are final
            bound = slab.bind(home, self.compute_dtype, stable=True)
            self._write(layer, self._resident_forms(bound, layer))
            self._layer_device_bytes[layer] = slab.nbytes
            return
        if self.backend is None and tier == Tier.STREAMED:
            self._make_ring(self.slabs[layer].nbytes)
        self.tiers[layer] = tier
        self._reorder()

    # ---- helpers -----------------------------------------------------------------------------------
    def _check_fits_ring(self, layer: int) -> None:
        """A layer that starts to stream fits the ring's slots (none yet: the ring is made for it)."""
        slot = self.backend.slots[0].nbytes if self.backend is not None else None
        if slot is not None and self.slabs[layer].nbytes > slot:
            raise ValueError(f"layer {layer} cannot stream: its host form takes {self.slabs[layer].nbytes} bytes and "
                             f"the staging ring's slots {slot} (sized at start-up for the layers that streamed "
                             f"then); start with --offload dynamic, or with this layer streamed (--layer-tiers)")

    def _place_direct_scales(self, layer: int) -> None:
        """With scales in device memory, book a DIRECT layer's scales and copy them there (its direct weights,
        which ``_bind_ring`` then writes)."""
        if not self.direct_scales_on_device:
            return
        if layer not in self.slabs:
            self._build_slab(layer, self._layer_refs(layer))
        slab = self.slabs[layer]
        nbytes = slab.scale_bytes()
        self._book("direct_scales", nbytes)
        try:
            slab.direct(self.compute_dtype, scales_on_device=True)
        except BaseException:
            self._book("direct_scales", -nbytes)
            raise
        self._direct_scale_bytes[layer] = nbytes

    def _drop_direct_scales(self, layer: int) -> None:
        if layer in self._direct_scale_bytes:
            self.slabs[layer].forget_direct()
            self._book("direct_scales", -self._direct_scale_bytes.pop(layer))

    def _write(self, layer: int, weights: dict[str, object]) -> None:
        for name, ref in self._layer_refs(layer).items():
            ref.current = weights[name]

    def _layer_refs(self, layer: int) -> dict:
        """The WeightRefs a layer's tier governs: all of its linears but its routed experts."""
        refs = self.model.layer_weight_refs(layer)
        experts = self._expert_refs(layer)
        if not experts:
            return refs
        owned = {id(ref) for expert in experts for ref in expert.values()}
        return {name: ref for name, ref in refs.items() if id(ref) not in owned}

    def _book(self, kind: str, nbytes: int) -> None:
        """Reserve (``nbytes`` >= 0) or release device bytes; a reservation that does not fit raises first."""
        if self.ledger is not None:
            if nbytes >= 0:
                self.ledger.reserve(kind, nbytes)
            else:
                self.ledger.release(kind, -nbytes)
        if kind == "resident_weights":
            self.device_weight_bytes += nbytes

    def close(self) -> None:
        """Finish outstanding copies, detach from the model and free every slab (idempotent)."""
        if self._closed:
            return
        self._closed = True
        if isinstance(self._schedule, StreamingSchedule):
            self._schedule.drain()
        self._schedule = NULL_HOOKS
        if self.backend is not None:
            self.backend.close()
            self.backend = None
        if self.expert_ring is not None:
            self.expert_ring.close()
            self.expert_ring = None
        if self.cpu_expert_pool is not None:
            self.cpu_expert_pool.close()
        for layer, tier in enumerate(self.tiers):
            if tier != Tier.RESIDENT:
                for ref in self._layer_refs(layer).values():
                    ref.current = CLOSED_WEIGHT
        for layer, tiers in self.expert_tiers.items():
            self.model.set_expert_access(layer, NO_EXPERT_ACCESS)
            for expert, tier in enumerate(tiers):
                if tier != Tier.RESIDENT:
                    self._write_expert(layer, expert, {"gate_up_proj": CLOSED_WEIGHT, "down_proj": CLOSED_WEIGHT})
        for slab in [*self.slabs.values(), *self.expert_slabs.values()]:
            slab.free()
        self.slabs.clear()
        self.expert_slabs.clear()
        self._slot_weights.clear()
