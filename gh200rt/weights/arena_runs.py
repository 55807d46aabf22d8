"""The resident layers' runs of the device arena: the KV cache's blocks lent to weights.

``ArenaRuns`` is a part of ``WeightStore`` (store.py). Where the engine gives the store a ``DeviceArena``, a
resident layer (or a resident routed expert, expert_placement.py) lives in a run of contiguous arena blocks taken
from the KV cache; demoting it gives the run back. Every run moves its bytes from the ledger's ``kv_pool`` to
``arena_weights`` and back. The methods here use the store's attributes and helpers (``arena``, ``_book``,
``_write``, ``_resident_form``).
"""
from __future__ import annotations

from gh200rt.weights.layer_slab import LayerSlab, WeightLayout
from gh200rt.weights.tiers import Tier


class NoFreeRun(RuntimeError):
    """A promotion found no run of free contiguous arena blocks (requests hold a block in every window)."""


class ArenaRuns:
    @property
    def layer_run_blocks(self) -> int:
        """Arena blocks one decoder layer's weights take (the largest layer)."""
        if self.arena is None:
            return 0
        if self.slabs:
            return self.arena.blocks_for(max(s.layout.nbytes for s in self.slabs.values()))
        return max(self.arena.pool.runs.values(), default=0)

    def _keep_promotion_room(self) -> None:
        """Dynamic tiers: the KV cache takes the blocks where the streamed layers would promote last
        (``BlockPool.set_reserve``), so a promotion finds a whole window once demand falls."""
        if self.arena is not None and self.keep_host_copies:
            self.arena.pool.set_reserve(len(self.layers(Tier.STREAMED)) * self.layer_run_blocks)

    def _place_in_arena(self, layer: int, layout: WeightLayout, slab: LayerSlab | None = None) -> None:
        """The layer's weights into a run of arena blocks: from ``slab`` (a promotion: the bits it streamed)
        or from ``layout``'s own tensors (start-up). On the bf16 and fp16 CPU routes the resident form is a
        converted copy of its own, so the run is booked and left unwritten; on the fp32 route a weight too small
        for oneDNN stays dense in the run (the others become reordered copies of it)."""
        start = self._take_run(layout.nbytes, f"layer {layer}", f"; it stays {self.tiers[layer]}")
        source = slab.tensor if slab is not None else None
        if self.cpu_linear_format not in (None, "onednn-fp32", "onednn-fp32+native"):  # all converted: run unwritten
            bound = layout.bind(source, self.compute_dtype, stable=True) if slab is not None else layout.forms
            weights = self._resident_forms(bound, layer)
        else:  # fp32: the dense weights in the run (too small for oneDNN, or the native kernel's), reordered copies
            if slab is not None:
                weights = slab.bind(slab.device_copy(into=self.arena.run(start)), self.compute_dtype, stable=True)
            else:
                run = self.arena.run(start)
                layout.fill(run)
                weights = layout.bind(run, self.compute_dtype, stable=True)
            weights = self._resident_forms(weights, layer)
        self._runs[layer] = start
        self._write(layer, weights)

    def _return_run(self, layer: int) -> None:
        self._give_back_run(self._runs.pop(layer))

    def _take_run(self, nbytes: int, holder: str, outcome: str = "") -> int:
        """A run of free arena blocks for ``nbytes`` of weights, moved from the KV cache's booking to the
        weights'; its first block. Raises ``NoFreeRun`` (``holder`` needs..., then ``outcome``) or
        ``LedgerOverCommit`` having taken nothing."""
        start = self.arena.take_run(nbytes)
        if start is None:
            raise NoFreeRun(f"{holder} needs {self.arena.blocks_for(nbytes)} contiguous free blocks of the device "
                            f"arena and requests hold a block in every such window ({self.arena.pool.num_free} of "
                            f"{self.arena.num_blocks} blocks free){outcome}")
        run_bytes = self.arena.pool.runs[start] * self.arena.block_bytes
        try:
            self._book("kv_pool", -run_bytes)
            self._book("arena_weights", run_bytes)
        except BaseException:
            self.arena.pool.return_run(start)
            raise
        return start

    def _give_back_run(self, start: int) -> None:
        """The run at ``start`` back to the KV cache (zeroed by the arena), and its booking."""
        run_bytes = self.arena.pool.runs[start] * self.arena.block_bytes
        self.arena.return_run(start)
        self._book("arena_weights", -run_bytes)
        self._book("kv_pool", run_bytes)
