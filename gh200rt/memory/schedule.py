"""The streaming schedule: which offloaded layers go through the staging ring in a step, and when.

The layers that run through the ring in a step form its *order*; the layer at position p of the order
uses slot p mod K. Before position p runs: issue the copy of position p + d, wait for p's copy. After
it: mark p's slot free. A forward pass starts by issuing positions 0..d.

Two orders exist. Small steps (decode) stream only the STREAMED layers. A step of at least
``large_step_tokens`` tokens also stages the DIRECT layers, because host_gemm would read their
weights over the link once per 64 rows (the cost model sets the threshold). ``begin_step`` picks the
order; when it changes, ``rebind(order)`` points every offloaded layer's WeightRefs at its slot for
that order (or back at its host slab), between steps, so no kernel is reading the old binding's
slots through a stale reference.
"""
from __future__ import annotations

from typing import Callable

import torch

from gh200rt.models.base import LayerSchedule


class StreamingSchedule(LayerSchedule):
    def __init__(self, streamed: list[int], slabs: dict[int, torch.Tensor], backend, slots: int, distance: int,
                 staged_direct: list[int] | None = None, large_step_tokens: int | None = None,
                 rebind: Callable[[list[int]], None] | None = None):
        self.slabs, self.backend = slabs, backend
        self.slots, self.distance = slots, distance
        self.decode_order = list(streamed)
        self.large_order = sorted(set(streamed) | set(staged_direct or ()))
        self.large_step_tokens = large_step_tokens if staged_direct else None
        assert self.large_step_tokens is None or rebind is not None, "staging direct layers needs rebind"
        self.rebind = rebind
        self._use(self.decode_order)

    def _use(self, order: list[int]) -> None:
        self.order = order
        self.position = {layer: p for p, layer in enumerate(order)}

    def begin_step(self, num_tokens: int) -> None:
        large = self.large_step_tokens is not None and num_tokens >= self.large_step_tokens
        order = self.large_order if large else self.decode_order
        if order is not self.order:
            self.rebind(order)
            self._use(order)

    def _prefetch(self, p: int) -> None:
        if p < len(self.order):
            self.backend.copy(p % self.slots, self.slabs[self.order[p]])

    def before_layer(self, index: int) -> None:
        p = self.position.get(index)
        if p is None:
            return
        if p == 0:
            for q in range(self.distance + 1):
                self._prefetch(q)
        else:
            self._prefetch(p + self.distance)
        self.backend.wait_copy(p % self.slots)

    def after_layer(self, index: int) -> None:
        p = self.position.get(index)
        if p is not None:
            self.backend.compute_done(p % self.slots)
