"""The decoder layers' staging ring: the store's side of streaming.

``LayerStaging`` is a part of ``WeightStore`` (store.py): it books and makes the ring (a transfer backend of
``staging_slots`` slots), hands it to a ``StreamingSchedule`` (schedule.py), and, whenever the order of the layers
through the ring changes, points each offloaded layer's WeightRefs at its slot or, for a direct layer outside the
order, at its host slab. It is the store's ``LayerHooks``: the model runner's hooks go to the schedule. The
methods here use the store's attributes and helpers (``tiers``, ``slabs``, ``_book``, ``_write``).
"""
from __future__ import annotations

from gh200rt.transfer.backend import make_transfer_backend
from gh200rt.weights.schedule import ForwardingHooks, LayerHooks, StreamingSchedule
from gh200rt.weights.tiers import Tier, slot_of


class LayerStaging(ForwardingHooks):
    def _ring_users(self) -> list[int]:
        staged_direct = self.layers(Tier.DIRECT) if self._direct_staging_tokens else []
        return sorted(self.layers(Tier.STREAMED) + staged_direct)

    def _make_ring(self, slot_bytes: int) -> None:
        self._book("staging_ring", slot_bytes * self._num_slots)
        self.backend = make_transfer_backend(self.device, slot_bytes, self._num_slots, self.poison)
        distance = self._distance if self._distance is not None else self._num_slots - 1
        self._schedule = StreamingSchedule(self.backend, distance, lambda layer: self.slabs[layer].tensor,
                                           self._bind_ring, wrap_steps=self.prefetch_across_steps)

    def _reorder(self) -> None:
        if isinstance(self._schedule, StreamingSchedule):
            self._schedule.set_orders(self.layers(Tier.STREAMED), self._ring_users(), self._direct_staging_tokens)
        else:
            self._bind_ring([])

    def _bind_ring(self, order: list[int]) -> None:
        """Point each offloaded layer's WeightRefs at its slot in ``order``, or, for a direct layer outside
        ``order``, at its host slab as the device reads it in place."""
        position = {layer: p for p, layer in enumerate(order)}
        for layer, tier in enumerate(self.tiers):
            if tier == Tier.RESIDENT:
                continue
            slab = self.slabs[layer]
            if layer in position:
                self._write(layer, self._slot_binding(layer, slot_of(position[layer], self._num_slots)))
            else:
                assert tier == Tier.DIRECT, (layer, tier, order)
                self._write(layer, slab.direct(self.compute_dtype, self.direct_scales_on_device))

    def _slot_binding(self, layer: int, slot: int) -> dict[str, object]:
        """``layer``'s weights over staging slot ``slot``, built once per (slab, slot tensor): switching between
        the decode and large-step orders then points the refs at the same objects over the same memory."""
        slab, tensor = self.slabs[layer], self.backend.slots[slot]
        cached = self._slot_weights.get((layer, slot))
        if cached is None or cached[0] is not slab or cached[1] is not tensor:
            cached = self._slot_weights[(layer, slot)] = (
                slab, tensor, slab.bind(tensor, self.compute_dtype, stable=False))
        return cached[2]

    # ---- hooks the model runner drives: the schedule's -------------------------------------------
    def inner_hooks(self) -> LayerHooks:
        return self._schedule
