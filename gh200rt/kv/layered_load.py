"""A step's loads from the host KV tier, layer by layer: layer N's share of the blocks reaches the device before
layer N's attention reads it, and no sooner than it must.

The model runner takes a step's loads (``KVOffloader.start_layered_load``) before the model runs and calls
``ready(layer)`` before each decoder layer, ``finish()`` after the step (or where the step runs its layers in one
call: a CUDA graph, the native decode stack).

* On a GPU every layer's copies are queued at once on the tier's load stream, after the work queued so far on the
  compute stream (a block freed and taken again may still be written by a step in flight), each layer's followed by
  an event; ``ready(layer)`` makes the compute stream wait for that event only. So the copies of layer N + 1 run
  while layer N computes, and a step whose prompt has many blocks in host memory starts computing after one layer's
  copies, not after all of them. A layer's copies are one kernel gathering its rows of every block from the tier as
  the device maps it (pinned memory: over NVLink-C2C on GH200, PCIe on x86). Where the tier is not mapped, the
  blocks are copied whole (one copy per block: per block and layer would be 65k launches for a 2048-block prefix of
  a 32-layer model) and every layer waits for them.
* On the CPU the copies run in ``ready(layer)`` itself, on the step's thread: the same bytes, moved just before
  their reader (there is no second engine to overlap them with; ``auto`` reads host blocks in place there anyway).

The host blocks stay pinned in the tier until every copy has run; the bytes are the tier's, so a request computes
the bits it would from a device hit.
"""
from __future__ import annotations

import time

import torch


class LayeredLoad:
    """``pairs``: (host block, device block id) to load; ``num_layers``: the pool's layers."""

    def __init__(self, offloader, pairs: list, num_layers: int):
        self.offloader, self.pairs, self.num_layers = offloader, pairs, num_layers
        self.slots = [block.slot for block, _ in pairs]
        self.block_ids = [block_id for _, block_id in pairs]
        self._next = 0                    # the CPU's: layers before it are copied
        self._events: list | None = None
        self._seconds = 0.0
        self._finished = False
        stream = offloader.load_stream
        if stream is not None:
            started = time.perf_counter()
            stream.wait_stream(torch.cuda.current_stream(offloader.device))
            self._events = []
            with torch.cuda.stream(stream):
                if offloader.device_tier is None:
                    offloader.blocks.write_many(self.slots, self.block_ids, non_blocking=True)
                    event = torch.cuda.Event()
                    event.record(stream)
                    self._events = [event] * num_layers
                for layer in range(num_layers if offloader.device_tier is not None else 0):
                    offloader.blocks.write_layer(layer, self.slots, self.block_ids, offloader.device_tier)
                    event = torch.cuda.Event()
                    event.record(stream)
                    self._events.append(event)
            self._seconds = time.perf_counter() - started

    def ready(self, layer: int) -> None:
        """Layer ``layer``'s blocks are on the device for what runs next (on a GPU: for the compute stream)."""
        if self._events is not None:
            torch.cuda.current_stream(self.offloader.device).wait_event(self._events[layer])
            return
        started = time.perf_counter()
        while self._next <= layer:
            self.offloader.blocks.write_layer(self._next, self.slots, self.block_ids)
            self._next += 1
        self._seconds += time.perf_counter() - started

    def finish(self) -> None:
        """Every layer ready; the host blocks let go of once the copies have run (counted in the tier's stats)."""
        if self._finished:
            return
        self._finished = True
        self.ready(self.num_layers - 1)
        held = [block for block, _ in self.pairs]
        self.offloader.loaded(held, self._seconds, None if self._events is None else self._events[-1])
