"""The routed experts' half of the weight store: each expert of an MoE layer placed on its own.

``ExpertPlacement`` is a part of ``WeightStore`` (store.py), kept apart because it is its own concept: an MoE
layer's attention, router and shared expert follow the layer's tier, while each routed expert is resident (a
device copy of its span, a run of the device arena where there is one), direct (read in place from the layer's
expert slab, ``expert_slab.py``), streamed (copied into the expert ring only in the steps that route to it,
``expert_staging.py``) or cpu (computed by the host's cores, ``expert_cpu.py``; read as an offloaded expert is in
the steps the device computes it). ``set_expert_tier`` moves one expert between steps. The store's bookkeeping (ledger,
arena, platform, slab cache) is shared: the methods here use the store's attributes and helpers.
"""
from __future__ import annotations

from gh200rt.backends.cpu.prepack import route_form_extra_bytes
from gh200rt.planner.layout import cpu_expert_fallback
from gh200rt.weights.expert_slab import ExpertSlab
from gh200rt.weights.expert_staging import EXPERT_STAGING_SLOTS, ExpertRing, ExpertStaging
from gh200rt.weights.layer_slab import LayerSlab
from gh200rt.weights.tiers import Tier


def _prefix(refs: dict) -> str:
    """``mlp.experts.E.`` of an expert's refs (keyed ``mlp.experts.E.gate_up_proj``)."""
    return next(iter(refs)).rpartition(".")[0] + "."


class ExpertPlacement:
    def expert_counts(self) -> dict[str, int]:
        flat = [t for tiers in self.expert_tiers.values() for t in tiers]
        return {tier.value: flat.count(tier) for tier in Tier}

    def _expert_refs(self, layer: int) -> list[dict]:
        refs_of = getattr(self.model, "expert_weight_refs", None)
        return refs_of(layer) if refs_of is not None else []

    def _place_experts(self, expert_tiers: list[list[Tier]]) -> None:
        """Every MoE layer's experts per ``expert_tiers`` (per layer, a tier per expert). A layer with an expert
        off the device (or any, with dynamic tiers) gets an expert slab of all its experts, from which its resident
        ones get their homes once the arena exists (``WeightStore.apply``); the others are bound now."""
        for layer, tiers in enumerate(expert_tiers):
            if not tiers:
                continue
            assert len(tiers) == len(self._expert_refs(layer)), (layer, len(tiers))
            self.expert_tiers[layer] = [Tier(t) for t in tiers]
            if self.keep_host_copies or any(t != Tier.RESIDENT for t in self.expert_tiers[layer]):
                self._build_expert_slab(layer)
        for layer, tiers in self.expert_tiers.items():
            for expert, tier in enumerate(tiers):
                if tier != Tier.RESIDENT:
                    self._bind_offloaded_expert(layer, expert)

    def expert_direct_read_bytes(self) -> int:
        """Bytes of direct experts read in place since start: one expert span per step that routes to it."""
        return sum(access.direct_reads * access.slab.expert_nbytes for access in self._stagings())

    def _stagings(self) -> list[ExpertStaging]:
        accesses = [self.model.layers[layer].mlp.expert_access for layer in self.expert_tiers]
        return [a for a in accesses if isinstance(a, ExpertStaging)]

    def _build_expert_slab(self, layer: int) -> None:
        experts = [{name: ref.current for name, ref in refs.items()} for refs in self._expert_refs(layer)]
        node, key = self.platform.host_numa_node, f"experts-{layer}"
        cache = self._cacheable(layer, {name: w for weights in experts for name, w in weights.items()})
        if cache is not None:
            metas = [{name.rpartition(".")[2]: self._meta_form(w) for name, w in weights.items()} for weights in experts]
            slab = LayerSlab.from_cache(ExpertSlab.flat(metas), node, self.platform, self.device, cache, key,
                                        self.quant_workers)
            if slab is not None:
                self.expert_slabs[layer] = ExpertSlab(metas, node, self.platform, self.device, slab)
                return
        forms = [{name.rpartition(".")[2]: self._host_form(layer, name, w) for name, w in weights.items()}
                 for weights in experts]
        self.expert_slabs[layer] = experts_slab = ExpertSlab(forms, node, self.platform, self.device)
        if cache is not None:
            layout = experts_slab.slab.layout
            cache.write(key, layout, experts_slab.slab.tensor[:layout.nbytes])

    def _write_expert(self, layer: int, expert: int, weights: dict[str, object]) -> None:
        for name, ref in self._expert_refs(layer)[expert].items():
            ref.current = weights[name.rpartition(".")[2]]

    def _bind_offloaded_expert(self, layer: int, expert: int) -> None:
        slab = self.expert_slabs[layer]
        staging = self._staging(layer)      # counts direct reads, hands cpu-tier experts to the host
        self._set_host_expert(layer, expert)
        if staging.device_tier(expert) == Tier.DIRECT:
            self._write_expert(layer, expert, slab.direct(expert, self.compute_dtype))
            return
        if self.expert_ring is None:
            slot_bytes = max(s.expert_nbytes for s in self.expert_slabs.values())
            self._book("staging_ring", slot_bytes * EXPERT_STAGING_SLOTS)
            self.expert_ring = ExpertRing(self.device, slot_bytes, self.poison)
            for access in self._stagings():
                access.ring = self.expert_ring
        staging.bind_slot(expert, 0)   # until a step routes to it: a slot, never the home it left

    def _staging(self, layer: int) -> ExpertStaging:
        access = self.model.layers[layer].mlp.expert_access
        if not isinstance(access, ExpertStaging):
            access = ExpertStaging(self.expert_ring, self.expert_slabs[layer], self.expert_tiers[layer],
                                   lambda expert, weights: self._write_expert(layer, expert, weights),
                                   self.compute_dtype,
                                   cpu_expert_fallback(self.platform) if self.platform is not None else Tier.DIRECT)
            access.cpu_max_tokens = self.cpu_max_tokens
            self.model.set_expert_access(layer, access)
        return access

    def _set_host_expert(self, layer: int, expert: int) -> None:
        """Hand expert ``expert`` to the host's cores when its tier is cpu, take it back otherwise."""
        if self.expert_tiers[layer][expert] != Tier.CPU:
            access = self.model.layers[layer].mlp.expert_access
            if isinstance(access, ExpertStaging):
                access.host_weights.pop(expert, None)
            return
        staging = self._staging(layer)
        if self.cpu_expert_pool is None:
            if self.cpu_pool_factory is None:
                raise ValueError("a routed expert was placed on the cpu tier, but this engine has no cpu expert pool")
            self.cpu_expert_pool = self.cpu_pool_factory()
        if staging.cpu_pool is None:
            down = self._expert_refs(layer)[expert]
            hidden, intermediate = next(ref.shape for name, ref in down.items() if name.endswith("down_proj"))
            staging.cpu_pool = self.cpu_expert_pool
            staging.host_mlp = self.cpu_expert_pool.mlp_for(hidden, intermediate, self.compute_dtype)
            staging.host_mlp.check(self.expert_slabs[layer].host(expert, self.compute_dtype),
                                   f"layer {layer}'s routed experts")
        staging.host_weights[expert] = self.expert_slabs[layer].host(expert, self.compute_dtype)

    def cpu_tier_counts(self) -> dict[str, dict[str, int]]:
        """cpu-tier experts' runs and (token, choice) pairs since start, by where they were computed."""
        runs, pairs = {"cpu": 0, "device": 0}, {"cpu": 0, "device": 0}
        for access in self._stagings():
            for where in runs:
                runs[where] += access.cpu_tier_runs[where]
                pairs[where] += access.cpu_tier_pairs[where]
        return {"runs": runs, "pairs": pairs}

    def _expert_form_bytes(self, layer: int, expert: int) -> int:
        """What the CPU route's resident form of an expert holds beside its own bytes."""
        slab = self.expert_slabs.get(layer)
        weights = slab.bind(slab.source(expert), self.compute_dtype, stable=True) if slab is not None else \
            {name: ref.current for name, ref in self._expert_refs(layer)[expert].items()}
        return sum(route_form_extra_bytes(w, self.cpu_linear_format) for w in weights.values())

    def _home_expert(self, layer: int, expert: int, book_forms: bool = True) -> None:
        """Make expert ``expert`` of ``layer`` resident. Where its layer has an expert slab it gets exactly the
        bits it streams: a run of the device arena when there is one (its blocks come from the KV cache, so
        demoting it gives them back), else a device buffer of its own; without a slab it keeps its own weights,
        placed with the model. Its route form's extra bytes are booked here when ``book_forms``. Raises
        ``NoFreeRun`` / ``LedgerOverCommit`` having changed nothing."""
        refs = self._expert_refs(layer)[expert]
        slab = self.expert_slabs.get(layer)
        forms = self._expert_form_bytes(layer, expert)
        if book_forms:
            self._book("cpu_route_forms", forms)
        device_bytes = 0
        try:
            if slab is None:
                weights = {name.rpartition(".")[2]: ref.current for name, ref in refs.items()}
            elif self.arena is not None:
                weights = self._expert_into_arena(layer, expert, slab)
            else:
                device_bytes = slab.expert_nbytes
                self._book("resident_weights", device_bytes)
                weights = slab.bind(slab.device_copy(expert, self.device), self.compute_dtype, stable=True)
        except BaseException:
            if (layer, expert) in self._expert_runs:
                self._return_expert_run(layer, expert)
            self._book("resident_weights", -device_bytes)
            if book_forms:
                self._book("cpu_route_forms", -forms)
            raise
        self._expert_booked[(layer, expert)] = (device_bytes, forms)
        prefix = _prefix(refs)
        self._write_expert(layer, expert, {short: self._resident_form(w, layer, prefix + short)
                                           for short, w in weights.items()})

    def _expert_into_arena(self, layer: int, expert: int, slab: ExpertSlab) -> dict[str, object]:
        """A run of arena blocks for the expert, taken from the KV cache; its weights over it (on the bf16 and
        fp16 CPU routes the resident form is a converted copy of its own: the run is booked, left unwritten)."""
        start = self._take_run(slab.expert_nbytes, f"layer {layer}'s expert {expert}")
        self._expert_runs[(layer, expert)] = start
        if self.cpu_linear_format not in (None, "onednn-fp32", "onednn-fp32+native"):
            return slab.bind(slab.source(expert), self.compute_dtype, stable=True)
        home = self.arena.run(start)[:slab.expert_nbytes]
        home.copy_(slab.source(expert))
        return slab.bind(home, self.compute_dtype, stable=True)

    def _return_expert_run(self, layer: int, expert: int) -> None:
        self._give_back_run(self._expert_runs.pop((layer, expert)))

    @property
    def expert_run_blocks(self) -> int:
        """Arena blocks one routed expert takes (0: no expert slab or no arena)."""
        if self.arena is None or not self.expert_slabs:
            return 0
        return self.arena.blocks_for(max(s.expert_nbytes for s in self.expert_slabs.values()))

    def set_expert_tier(self, layer: int, expert: int, tier: Tier | str) -> None:
        """Move one routed expert between steps. A promotion that does not fit the ledger raises
        ``LedgerOverCommit`` and changes nothing."""
        if self._closed:
            raise RuntimeError("this weight store was closed with its engine; build a new engine")
        if layer not in self.expert_tiers:
            raise ValueError(f"layer {layer} has no routed experts")
        tier, old = Tier(tier), self.expert_tiers[layer][expert]
        if tier == old:
            return
        if layer not in self.expert_slabs:
            self._build_expert_slab(layer)
        self.plan_version += 1
        if tier == Tier.RESIDENT:
            self.expert_tiers[layer][expert] = tier
            try:
                self._home_expert(layer, expert)
            except BaseException:
                self.expert_tiers[layer][expert] = old
                raise
            self._set_host_expert(layer, expert)
            return
        self.expert_tiers[layer][expert] = tier
        self._bind_offloaded_expert(layer, expert)
        if old == Tier.RESIDENT:
            device_bytes, forms = self._expert_booked.pop((layer, expert), (0, 0))
            self._book("resident_weights", -device_bytes)
            self._book("cpu_route_forms", -forms)
            if (layer, expert) in self._expert_runs:
                self._return_expert_run(layer, expert)
