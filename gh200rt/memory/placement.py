"""Placement: apply a Plan to a loaded model — device homes, host slabs, staging slots, streaming.

Contract: ``Placement(plan, device, platform, host_format, poison).apply(model, quantized)``:
- parameters, buffers and every linear weight outside the offloaded layers move to ``device``;
- each offloaded layer's linear weights take their host form (host_format.py) in ONE exact-size
  slab on the platform's host NUMA node, parts back to back at 64-byte alignment, registered for
  DMA where CUDA is present; the dense originals are dropped layer by layer;
- a ``direct`` layer's WeightRefs point at views of its slab as the device sees it (device_view);
- a ``streamed`` layer's WeightRefs point at views of its staging slot (slot = position mod K;
  fixed addresses) and a ``StreamingSchedule`` (schedule.py) drives the transfer backend from the
  model's layer hooks;
- when the plan says so (``direct_staging_tokens``, GPU platforms), steps that long also stage the
  direct layers through the ring, and the schedule rebinds their refs for those steps.
``device_weight_bytes``, ``staging_bytes`` and ``host_slab_bytes`` are what the ledger books.
``close()`` releases every slab it placed: the offloaded layers' WeightRefs are pointed at
``CLOSED_WEIGHT`` and the schedule detached, so no view keeps a slab's pages (or their CUDA
registration) alive after the engine is gone.
"""
from __future__ import annotations

import torch

from gh200rt.kernels.quant import PackedWeight
from gh200rt.memory import host_format
from gh200rt.memory.device_view import device_view, direct_weight, prepare_slab_for_device
from gh200rt.memory.slabs import allocate_slab
from gh200rt.memory.schedule import StreamingSchedule
from gh200rt.models.base import NULL_SCHEDULE
from gh200rt.models.llama import FUSED_SHARDS
from gh200rt.models.layers.linear import RefLinear
from gh200rt.planner.cost_model import SLAB_ALIGN
from gh200rt.planner.planner import Plan
from gh200rt.platform.detect import Platform
from gh200rt.transfer.backend import make_transfer_backend

# (linear name, part name, shape, dtype, byte offset in the slab)
Layout = list[tuple[str, str, tuple, torch.dtype, int]]


def _layout(forms: dict[str, object]) -> tuple[Layout, int]:
    layout, offset = [], 0
    for name, form in forms.items():
        for part, tensor in host_format.storage_parts(form).items():
            offset = -(-offset // SLAB_ALIGN) * SLAB_ALIGN
            layout.append((name, part, tuple(tensor.shape), tensor.dtype, offset))
            offset += tensor.nbytes
    return layout, offset


def _views(buffer: torch.Tensor, layout: Layout) -> dict[str, dict[str, torch.Tensor]]:
    out: dict[str, dict[str, torch.Tensor]] = {}
    for name, part, shape, dtype, offset in layout:
        nbytes = torch.Size(shape).numel() * dtype.itemsize
        out.setdefault(name, {})[part] = buffer[offset:offset + nbytes].view(dtype).view(shape)
    return out


class _ClosedWeight:
    """What an offloaded layer's WeightRef holds once its placement was closed."""
    nbytes = 0

    def linear(self, x, bias=None):
        raise RuntimeError("this model's offloaded weights were released when its engine was closed; "
                           "build a new engine to generate again")


CLOSED_WEIGHT = _ClosedWeight()


class Placement:
    def __init__(self, plan: Plan, device: str = "cpu", platform: Platform | None = None,
                 host_format_name: str | None = None, poison: bool = False):
        self.plan, self.device, self.poison = plan, torch.device(device), poison
        self.platform = platform or plan.platform
        self.host_format = host_format_name
        self.slabs: dict[int, object] = {}
        self.backend = None
        self.device_weight_bytes = 0
        self._model = None
        self._offloaded: list[int] = []
        self._direct_bound: dict[int, dict[str, object]] = {}

    @property
    def num_kv_blocks(self) -> int:
        return self.plan.num_kv_blocks

    @property
    def staging_bytes(self) -> int:
        return sum(slot.nbytes for slot in self.backend.slots) if self.backend else 0

    def host_slab_bytes(self) -> int:
        return sum(s.nbytes for s in self.slabs.values())

    def apply(self, model, quantized: dict | None = None) -> None:
        """Place ``model`` (loaded on the host); ``quantized`` maps checkpoint names to GGUF tensors."""
        compute_dtype = model.dtype
        fmt = self.host_format or host_format.resolve_host_format("auto", self.device.type == "cpu", compute_dtype,
                                                                  bool(quantized))
        offloaded = [i for i, tier in enumerate(self.plan.tiers) if tier != "resident"]
        self._model, self._offloaded = model, offloaded
        layouts: dict[int, tuple[Layout, dict[str, object]]] = {}
        for i in offloaded:  # one layer at a time: its dense weights go as soon as the slab holds them
            refs = model.layer_weight_refs(i)
            forms = {name: host_format.host_form(ref.current, fmt, _gguf_parts(quantized, i, name))
                     for name, ref in refs.items()}
            layout, nbytes = _layout(forms)
            slab = allocate_slab(nbytes, self.platform.host_numa_node)
            for name, parts in _views(slab.tensor, layout).items():
                for part, view in parts.items():
                    view.copy_(host_format.storage_parts(forms[name])[part])
            if self.device.type != "cpu":  # a named profile may describe a GPU while the engine runs on the CPU
                prepare_slab_for_device(slab, self.platform)
            self.slabs[i], layouts[i] = slab, (layout, forms)
            for name, ref in refs.items():  # drop the dense original now; rebound below
                ref.current = host_format.bind(forms[name], _views(slab.tensor, layout)[name], compute_dtype,
                                               stable=True)
        if self.device.type != "cpu" and host_format.is_fp8_checkpoint(quantized):
            _keep_fp8_resident(model, quantized, [i for i in range(len(self.plan.tiers)) if i not in offloaded])
        self._move_to_device(model, set(offloaded))
        self._compute_dtype, self._layouts = compute_dtype, layouts
        streamed = [i for i in offloaded if self.plan.tiers[i] == "streamed"]
        staged_direct = self.plan.direct_layers if self.plan.direct_staging_tokens else []
        ring = sorted(streamed + staged_direct)
        if ring:
            slot_bytes = max(self.slabs[i].nbytes for i in ring)
            self.backend = make_transfer_backend(self.device, slot_bytes, self.plan.staging_slots, self.poison)
            model.layer_schedule = StreamingSchedule(streamed, {i: self.slabs[i].tensor for i in ring}, self.backend,
                                                     self.plan.staging_slots, self.plan.prefetch_distance,
                                                     staged_direct, self.plan.direct_staging_tokens, self._bind_ring)
        self._bind_ring(streamed)

    def _bind_ring(self, order: list[int]) -> None:
        """Point each offloaded layer's WeightRefs at its slot in ``order`` (slot = position mod K), or, for
        a direct layer outside ``order``, at its host slab as the device reads it in place."""
        position = {layer: p for p, layer in enumerate(order)}
        for i in self._offloaded:
            if i in position:
                layout, forms = self._layouts[i]
                slot = self.backend.slots[position[i] % self.plan.staging_slots]
                bound = {name: host_format.bind(forms[name], views, self._compute_dtype, stable=False)
                         for name, views in _views(slot, layout).items()}
            else:
                bound = self._direct_binding(i)
            for name, ref in self._model.layer_weight_refs(i).items():
                ref.current = bound[name]

    def _direct_binding(self, layer: int) -> dict[str, object]:
        """A direct layer's weights over its slab as the device reads it in place; built once and kept, so
        whatever a packed weight derives from stable storage survives the layer's visits to the ring."""
        if layer not in self._direct_bound:
            slab = self.slabs[layer]
            buffer = slab.tensor if self.device.type == "cpu" else device_view(slab, self.platform, self.device)
            layout, forms = self._layouts[layer]
            self._direct_bound[layer] = {
                name: host_format.bind(forms[name], views, self._compute_dtype, stable=True, wrap_dense=direct_weight)
                for name, views in _views(buffer, layout).items()}
        return self._direct_bound[layer]

    def _move_to_device(self, model, offloaded: set[int]) -> None:
        """Everything but the offloaded layers' linear weights goes to the device; count its bytes."""
        if self.device.type != "cpu":
            model.to(self.device)
        offloaded_refs = {id(ref) for i in offloaded for ref in model.layer_weight_refs(i).values()}
        seen: dict[int, int] = {}
        for module in model.modules():
            if isinstance(module, RefLinear) and id(module.weight_ref) not in offloaded_refs:
                ref = module.weight_ref
                if isinstance(ref.current, torch.Tensor) and ref.current.device != self.device:
                    ref.current = ref.current.to(self.device)
                if isinstance(ref.current, torch.Tensor):
                    seen[ref.current.data_ptr()] = ref.current.nbytes
                elif isinstance(ref.current, PackedWeight):  # an FP8 checkpoint's resident weight
                    ref.current = ref.current.with_tensors({n: t.to(self.device) for n, t in ref.current.tensors().items()})
                    seen.update({t.data_ptr(): t.nbytes for t in ref.current.tensors().values()})
        for tensor in [*model.parameters(), *model.buffers()]:
            seen[tensor.data_ptr()] = tensor.nbytes
        self.device_weight_bytes = sum(seen.values())

    def close(self) -> None:
        """Finish outstanding copies, detach from the model and free every slab (idempotent)."""
        if self.backend is not None:
            self.backend.close()
            self.backend = None
        model, self._model = self._model, None
        if model is not None:
            if isinstance(model.layer_schedule, StreamingSchedule):
                model.layer_schedule = NULL_SCHEDULE
            for i in self._offloaded:
                for ref in model.layer_weight_refs(i).values():
                    ref.current = CLOSED_WEIGHT
        self._direct_bound.clear()
        self._layouts = {}
        for slab in self.slabs.values():
            slab.free()
        self.slabs.clear()


def _keep_fp8_resident(model, quantized: dict, layers: list[int]) -> None:
    """On a GPU, a resident layer of an FP8 checkpoint keeps its fp8 weights (half the HBM of bf16, read
    by host_gemm with the row scales) instead of the dequantized copy the loader made."""
    for i in layers:
        for name, ref in model.layer_weight_refs(i).items():
            parts = _gguf_parts(quantized, i, name)
            if parts:
                ref.current = host_format.concat_rows(parts)


def _gguf_parts(quantized: dict | None, layer: int, name: str) -> list | None:
    """The checkpoint's quantized tensors (GGUF, or FP8 weights) whose rows make up linear ``name`` of ``layer``,
    or None when any is not quantized."""
    if not quantized:
        return None
    prefix = f"model.layers.{layer}."
    parts = [f"{prefix}{part}.weight" for part in FUSED_SHARDS.get(name, (name,))]
    return [quantized[p] for p in parts] if all(p in quantized for p in parts) else None
