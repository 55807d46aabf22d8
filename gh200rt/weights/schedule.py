"""The staging ring's copy schedule, driven by the model runner's hooks around every decoder layer.

The layers that run through the ring in a step form its *order*; the layer at position p uses slot
``slot_of(p, K)`` (tiers.py). Copies are issued in order, ``distance`` positions ahead of the
layer about to run, and each slot has one owner at a time: the copy issued into it, until the
compute that reads it is marked done. So a copy never overwrites a slot whose reader has not run.

Prefetch wraps across steps (``wrap_steps``): positions past the end of the order are the next
step's first ones, so in the tail of step n the first layers of step n+1 are already copying, while
the host samples, schedules and prepares step n+1. Such a copy waits for its slot's last reader in
step n (with L mod K != 0 that can be the last layer, so the copy starts after it). A step captured
into a CUDA graph must be self-contained: the graph runner wraps capture and replay in
``self_contained()``, which drains what an eager step issued ahead and turns wrapping off inside.

Two orders exist. Small steps (decode) stream only the STREAMED layers. A step of at least
``large_step_tokens`` tokens also stages the DIRECT layers, because host_gemm would read their
weights over the link once per 64 rows (the cost model sets the threshold). ``begin_step`` picks the
order; when it changes (or the store retiers a layer, ``set_orders``), copies already issued for the
old order are drained and ``rebind(order)`` points every offloaded layer's WeightRefs at its slot
for the new order, between steps, so no kernel reads a slot through a stale reference.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator

import torch

from gh200rt.weights.tiers import slot_of


class LayerHooks:
    """What the model runner calls around a forward pass: ``begin_step`` before it, ``before_layer`` /
    ``after_layer`` around decoder layer i. The default does nothing."""

    def begin_step(self, num_tokens: int) -> None:
        pass

    def before_layer(self, index: int) -> None:
        pass

    def after_layer(self, index: int) -> None:
        pass

    def between_layers(self) -> bool:
        """Whether ``before_layer`` / ``after_layer`` may do anything in the step begun (False: the layers may run
        without them, in one call). Hooks that override either say True unless they say otherwise."""
        cls = type(self)
        return cls.before_layer is not LayerHooks.before_layer or cls.after_layer is not LayerHooks.after_layer

    @contextmanager
    def self_contained(self) -> Iterator[None]:
        """Around a step captured into a graph, or replayed from one: no copy crosses its boundaries."""
        yield

    def graph_captured(self, graph) -> None:
        """``graph`` was just captured (its staging copies are counted on each replay)."""

    def replay(self, graph) -> None:
        """Launch a captured ``torch.cuda.CUDAGraph``."""
        graph.replay()


NULL_HOOKS = LayerHooks()


class ForwardingHooks(LayerHooks):
    """Hooks that pass every call on to ``inner_hooks()``: the store passes the runner's calls to its staging
    schedule, and the runner's wrappers (host KV loads, layer timing) add their own work around some of them."""

    def inner_hooks(self) -> LayerHooks:
        raise NotImplementedError

    def begin_step(self, num_tokens: int) -> None:
        self.inner_hooks().begin_step(num_tokens)

    def before_layer(self, index: int) -> None:
        self.inner_hooks().before_layer(index)

    def after_layer(self, index: int) -> None:
        self.inner_hooks().after_layer(index)

    def between_layers(self) -> bool:
        return self.inner_hooks().between_layers()

    def self_contained(self):
        return self.inner_hooks().self_contained()

    def graph_captured(self, graph) -> None:
        self.inner_hooks().graph_captured(graph)

    def replay(self, graph) -> None:
        self.inner_hooks().replay(graph)


class StreamingSchedule(LayerHooks):
    """``sources(layer)`` is the host slab tensor a copy of ``layer`` reads; ``backend`` owns the K slots."""

    def __init__(self, backend, distance: int, sources: Callable[[int], torch.Tensor],
                 rebind: Callable[[list[int]], None], wrap_steps: bool = True):
        self.backend, self.sources, self.rebind = backend, sources, rebind
        self.wrap_steps = wrap_steps
        self.num_slots = len(backend.slots)
        assert 0 <= distance < self.num_slots, (distance, self.num_slots)
        self.distance = distance
        self._owned = [False] * self.num_slots   # a copy was issued into the slot and its reader has not run
        self._next = 0                           # next position to copy (>= len(order): the next step's)
        self.decode_order: list[int] = []
        self.large_order: list[int] = []
        self.large_step_tokens: int | None = None
        self.order: list[int] = []
        self.position: dict[int, int] = {}

    def set_orders(self, decode_order: list[int], large_order: list[int] | None = None,
                   large_step_tokens: int | None = None) -> None:
        """New orders (between steps): drain what was issued for the old one and bind the decode order."""
        self.decode_order = list(decode_order)
        self.large_order = list(large_order) if large_order and large_step_tokens else self.decode_order
        self.large_step_tokens = large_step_tokens if large_order else None
        self._switch(self.decode_order)

    def _switch(self, order: list[int]) -> None:
        self.drain()
        self.rebind(order)
        self.order = order
        self.position = {layer: p for p, layer in enumerate(order)}

    def begin_step(self, num_tokens: int) -> None:
        large = self.large_step_tokens is not None and num_tokens >= self.large_step_tokens
        order = self.large_order if large else self.decode_order
        if order is not self.order:
            self._switch(order)

    @contextmanager
    def self_contained(self) -> Iterator[None]:
        self.drain()        # copies issued ahead by an eager step are not part of the graph
        wrap, self.wrap_steps = self.wrap_steps, False
        try:
            yield
        finally:
            self.wrap_steps = wrap

    def graph_captured(self, graph) -> None:
        self.backend.graph_captured(graph)

    def replay(self, graph) -> None:
        self.backend.replay(graph)

    def drain(self) -> None:
        """Let every issued copy land and release its slot unread (the order it was issued for is gone)."""
        for slot, owned in enumerate(self._owned):
            if owned:
                self.backend.wait_copy(slot)
                self.backend.compute_done(slot)
                self._owned[slot] = False
        self._next = 0

    def _issue_through(self, last: int) -> None:
        """Issue copies in order for positions up to ``last`` (at most one step ahead), stopping at the first
        whose slot is still owned."""
        length = len(self.order)
        last = min(last, 2 * length - 1 if self.wrap_steps else length - 1)
        while self._next <= last:
            position = self._next % length
            slot = slot_of(position, self.num_slots)
            if self._owned[slot]:
                return
            self.backend.copy(slot, self.sources(self.order[position]))
            self._owned[slot] = True
            self._next += 1

    def between_layers(self) -> bool:
        return bool(self.position)    # no layer in the ring order: the hooks find no position and return

    def before_layer(self, index: int) -> None:
        p = self.position.get(index)
        if p is None:
            return
        self._issue_through(p + self.distance)
        assert self._next > p, f"the copy of ring position {p} could not be issued"
        self.backend.wait_copy(slot_of(p, self.num_slots))

    def after_layer(self, index: int) -> None:
        p = self.position.get(index)
        if p is None:
            return
        slot = slot_of(p, self.num_slots)
        self.backend.compute_done(slot)
        self._owned[slot] = False
        ahead = p + self.distance
        if p == len(self.order) - 1:          # the step's last ring layer: positions renumber from 0
            self._next -= len(self.order)
            ahead -= len(self.order)
            if not self.wrap_steps:
                return
        self._issue_through(ahead)
