"""Placement: apply a Plan to a model — host slabs, staging slots and the streaming LayerSchedule.

Contract: ``Placement(plan, poison=False).apply(model)`` moves each offloaded layer's dense linear
weights into ONE exact-size host slab (packed back to back), repoints the layer's WeightRefs to
views of the slab (direct) or of its staging slot (streamed; slot = position mod K, fixed
addresses, views built once) and installs a LayerSchedule: before_layer(i) prefetches streamed
position p+d and waits for p's copy; after_layer(i) marks the slot's compute done.
Only dense tensor weights are handled in v1 (packed quantized weights raise).
"""
from __future__ import annotations

import torch

from gh200rt.memory.slabs import allocate_slab
from gh200rt.models.base import LayerSchedule
from gh200rt.planner.planner import Plan
from gh200rt.transfer.cpu_backend import CpuTransferBackend


def _views(buffer: torch.Tensor, layout: list[tuple[str, tuple, torch.dtype, int]]) -> dict[str, torch.Tensor]:
    out = {}
    for name, shape, dtype, offset in layout:
        nbytes = torch.Size(shape).numel() * torch.empty(0, dtype=dtype).element_size()
        out[name] = buffer[offset:offset + nbytes].view(dtype).view(shape)
    return out


class StreamingSchedule(LayerSchedule):
    def __init__(self, streamed: list[int], slabs: dict[int, torch.Tensor], backend: CpuTransferBackend,
                 slots: int, distance: int):
        self.streamed, self.slabs, self.backend = streamed, slabs, backend
        self.position = {layer: p for p, layer in enumerate(streamed)}
        self.slots, self.distance = slots, distance

    def _prefetch(self, p: int) -> None:
        if p < len(self.streamed):
            self.backend.copy(p % self.slots, self.slabs[self.streamed[p]])

    def before_layer(self, index: int) -> None:
        p = self.position.get(index)
        if p is None:
            return
        if p == 0:  # a new forward pass: issue the first d+1 copies
            for q in range(self.distance + 1):
                self._prefetch(q)
        elif self.distance == 0:
            self._prefetch(p)
        else:
            self._prefetch(p + self.distance)
        self.backend.wait_copy(p % self.slots)

    def after_layer(self, index: int) -> None:
        p = self.position.get(index)
        if p is not None:
            self.backend.compute_done(p % self.slots)


class Placement:
    def __init__(self, plan: Plan, poison: bool = False, node: int = 0):
        self.plan, self.poison, self.node = plan, poison, node
        self.slabs: dict[int, object] = {}
        self.backend: CpuTransferBackend | None = None

    @property
    def num_kv_blocks(self) -> int:
        return self.plan.num_kv_blocks

    def host_slab_bytes(self) -> int:
        return sum(s.nbytes for s in self.slabs.values())

    def apply(self, model) -> None:
        layouts = {}
        for i, tier in enumerate(self.plan.tiers):
            if tier == "resident":
                continue
            refs = model.layer_weight_refs(i)
            layout, offset = [], 0
            for name, ref in refs.items():
                if not isinstance(ref.current, torch.Tensor):
                    raise NotImplementedError(f"layer {i} {name}: offloading packed quantized weights is not "
                                              f"supported yet; load with a dense dtype or use --offload none")
                offset = -(-offset // 64) * 64
                layout.append((name, tuple(ref.current.shape), ref.current.dtype, offset))
                offset += ref.current.nbytes
            slab = allocate_slab(offset, self.node)
            for (name, _, _, _), view in zip(layout, _views(slab.tensor, layout).values()):
                view.copy_(refs[name].current)
            self.slabs[i], layouts[i] = slab, layout
        streamed = [i for i, t in enumerate(self.plan.tiers) if t == "streamed"]
        if streamed:
            slot_bytes = max(self.slabs[i].nbytes for i in streamed)
            slots = [torch.empty(slot_bytes, dtype=torch.uint8) for _ in range(self.plan.staging_slots)]
            self.backend = CpuTransferBackend(slots, poison=self.poison)
            model.layer_schedule = StreamingSchedule(streamed, {i: self.slabs[i].tensor for i in streamed},
                                                     self.backend, self.plan.staging_slots,
                                                     self.plan.prefetch_distance)
        for i, layout in layouts.items():
            refs = model.layer_weight_refs(i)
            if self.plan.tiers[i] == "direct":
                buffer = self.slabs[i].tensor
            else:
                buffer = self.backend.slots[streamed.index(i) % self.plan.staging_slots]
            for name, view in _views(buffer, layout).items():
                refs[name].current = view


def build_placement(engine_config, arch, platform=None, dtype: str = "fp32", batch: int = 1,
                    poison: bool = False) -> tuple[Plan, Placement]:
    """The engine's entry point: ledger capacity + planner + Placement for ``arch``."""
    from gh200rt.memory.ledger import ledger_capacity
    from gh200rt.planner.cost_model import model_sizes
    from gh200rt.planner.planner import make_plan
    from gh200rt.platform.detect import detect

    memory = engine_config.memory
    platform = platform or detect(memory.platform)
    free = None if platform.kind == "cpu" else platform.device_memory_bytes
    plan = make_plan(model_sizes(arch, dtype), platform, memory, ledger_capacity(memory, free),
                     engine_config.cache.block_size, batch)
    return plan, Placement(plan, poison=poison, node=platform.host_numa_node)
