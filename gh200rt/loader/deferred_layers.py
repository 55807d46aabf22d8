"""Decoder layers' linear weights whose bytes the loader leaves in the checkpoint until the weight store asks.

With a quantized host format (``--host-weight-dtype int8|int4|fp8``) an offloaded layer's dense weights are only
read to be quantized into its host slab, and not at all when the slab cache (weights/slab_cache.py) holds that
slab. So ``load_model(..., defer_layer_linears=True)`` checks every such tensor against the checkpoint's header
(name, shape: the loader stays strict) but reads none; the store calls ``load(layer)`` just before it needs a
layer's dense weights (a resident layer, a slab the cache misses). A restart from the cache then reads the
embedding, the head, the norms and the slabs, not the whole checkpoint, and a first start holds one layer's dense
weights at a time beside the slabs instead of the whole model's (the model's dense tensors are never written, so
the memory behind them is never touched, and is released when the store repoints the layer at its slab).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from gh200rt.loader.errors import ModelLoadError


@dataclass(frozen=True)
class DeferredTensor:
    path: str                                   # the safetensors file
    name: str
    part: tuple[int, int, int] | None           # (dim, start, stop): a tensor-parallel rank's slice, or None
    destination: torch.Tensor                   # where the model wants it (a view of a layer's dense weight)


class DeferredLayers:
    def __init__(self, model, dtype: torch.dtype):
        self.dtype = dtype
        self._layer_of = _layer_linear_names(model)
        self._pending: dict[int, list[DeferredTensor]] = {}
        self.bytes_loaded = 0
        self.layers_loaded: list[int] = []

    def defers(self, name: str) -> bool:
        return name in self._layer_of

    def note(self, path: str, name: str, part, destination: torch.Tensor) -> None:
        self._pending.setdefault(self._layer_of[name], []).append(DeferredTensor(path, name, part, destination))

    def pending(self, layer: int) -> bool:
        return layer in self._pending

    @property
    def pending_layers(self) -> list[int]:
        return sorted(self._pending)

    def load(self, layer: int) -> None:
        """Read ``layer``'s deferred tensors into the model (nothing when none are pending)."""
        from gh200rt.loader.safetensors_dir import open_checkpoint_file, read_tensor
        tensors = self._pending.pop(layer, [])
        if tensors:
            self.layers_loaded.append(layer)
        by_file: dict[str, list[DeferredTensor]] = {}
        for tensor in tensors:
            by_file.setdefault(tensor.path, []).append(tensor)
        with torch.inference_mode():
            for path, group in by_file.items():
                with open_checkpoint_file(path) as f:
                    for tensor in group:
                        data = read_tensor(f, path, tensor.name, tensor.part)
                        if tuple(data.shape) != tuple(tensor.destination.shape):
                            raise ModelLoadError(f"{path}: {tensor.name} changed shape since the engine started "
                                                 f"({tuple(data.shape)}, expected {tuple(tensor.destination.shape)})")
                        tensor.destination.copy_(data.to(self.dtype))
                        self.bytes_loaded += tensor.destination.nbytes


    def release(self) -> None:
        """Forget what is still pending (layers whose slabs came from the cache): their dense tensors, never
        written, are freed with the last view of them."""
        self._pending.clear()


def _layer_linear_names(model) -> dict[str, int]:
    """Checkpoint name -> its decoder layer, for the tensors written into a layer's dense linear weights (q/k/v,
    o, gate/up, down): those the store may quantize into a slab. Biases, norms and MoE models are loaded at once
    (an MoE layer's experts are placed one by one, outside the layer slab)."""
    if getattr(getattr(model, "arch", None), "is_moe", False):
        return {}
    storages = {}
    for layer in range(len(model.layers)):
        for ref in model.layer_weight_refs(layer).values():
            if isinstance(ref.current, torch.Tensor):
                storages[ref.current.untyped_storage().data_ptr()] = layer
    return {name: storages[dest.untyped_storage().data_ptr()] for name, dest in model.weight_destinations().items()
            if dest.untyped_storage().data_ptr() in storages}
