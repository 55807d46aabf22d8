"""Decoder layers' linear weights whose bytes the loader leaves in the checkpoint until the weight store asks.

With a quantized host format (``--host-weight-dtype int8|int4|fp8``) an offloaded layer's dense weights are only
read to be quantized into its host slab, and not at all when the slab cache (weights/slab_cache.py) holds that
slab. So ``load_model(..., defer_layer_linears=True)`` checks every such tensor against the checkpoint's header
(name, shape: the loader stays strict) but reads none. The store calls ``load(layer)`` for a layer it keeps
resident, and ``host_forms(layer, ...)`` for a slab the cache does not hold: each checkpoint tensor quantized
straight from the file's memory map, never copied dense. A restart from the cache then reads the embedding, the
head, the norms and the slabs, not the whole checkpoint, and a first start neither copies the offloaded layers'
dense weights nor holds them beside the slabs (the model's dense tensors are never written, so the memory behind
them is never touched, and is released when the store repoints the layer at its slab).
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
    linear: str                                 # the layer's linear it is rows of (``layer_weight_refs`` name)
    first_row: int                              # its first row in that linear


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
        layer, linear, first_row = self._layer_of[name]
        self._pending.setdefault(layer, []).append(DeferredTensor(path, name, part, destination, linear, first_row))

    def pending(self, layer: int) -> bool:
        return layer in self._pending

    @property
    def pending_layers(self) -> list[int]:
        return sorted(self._pending)

    def load(self, layer: int) -> None:
        """Read ``layer``'s deferred tensors into the model (nothing when none are pending)."""
        with torch.inference_mode():
            for tensor, data in self._read(layer):
                tensor.destination.copy_(data.to(self.dtype))

    def host_forms(self, layer: int, fmt: str, workers: int) -> dict[str, object]:
        """``layer``'s linears quantized to ``fmt`` straight from the checkpoint's (memory-mapped) tensors, each
        checkpoint tensor's rows written into its linear's stacked result (every row is quantized on its own, so
        this is bit-identical to quantizing the model's dense copy), without writing the dense copy. The whole
        layer's row blocks share one pool of ``workers`` threads (``quantize_stacked``)."""
        from gh200rt.formats.quantizers import quantize_stacked
        parts: dict[str, list] = {}
        with torch.inference_mode():
            for tensor, data in self._read(layer):
                parts.setdefault(tensor.linear, []).append((tensor.first_row, data))
            groups = {}
            for linear, rows in parts.items():
                rows.sort(key=lambda r: r[0])
                starts = [first for first, _ in rows]
                assert starts == [sum(d.shape[0] for _, d in rows[:i]) for i in range(len(rows))], (linear, starts)
                groups[linear] = [data for _, data in rows]
            return quantize_stacked(groups, fmt, workers, dtype=self.dtype)

    def _read(self, layer: int):
        """(tensor, its data as stored: a view of the file's memory map where whole) of ``layer``'s deferred
        tensors, which stop being pending."""
        from gh200rt.loader.safetensors_dir import open_checkpoint_file, read_tensor
        tensors = self._pending.pop(layer, [])
        if tensors:
            self.layers_loaded.append(layer)
        by_file: dict[str, list[DeferredTensor]] = {}
        for tensor in tensors:
            by_file.setdefault(tensor.path, []).append(tensor)
        for path, group in by_file.items():
            with open_checkpoint_file(path) as f:
                for tensor in group:
                    data = read_tensor(f, path, tensor.name, tensor.part)
                    if tuple(data.shape) != tuple(tensor.destination.shape):
                        raise ModelLoadError(f"{path}: {tensor.name} changed shape since the engine started "
                                             f"({tuple(data.shape)}, expected {tuple(tensor.destination.shape)})")
                    self.bytes_loaded += tensor.destination.nbytes
                    yield tensor, data


    def release(self) -> None:
        """Forget what is still pending (layers whose slabs came from the cache): their dense tensors, never
        written, are freed with the last view of them."""
        self._pending.clear()


def _layer_linear_names(model) -> dict[str, tuple[int, str, int]]:
    """Checkpoint name -> (decoder layer, its linear, first row there), for the tensors written into a layer's
    dense linear weights (q/k/v, o, gate/up, down): those the store may quantize into a slab. Biases, norms and
    MoE models are loaded at once (an MoE layer's experts are placed one by one, outside the layer slab)."""
    if getattr(getattr(model, "arch", None), "is_moe", False):
        return {}
    linears = {}
    for layer in range(len(model.layers)):
        for linear, ref in model.layer_weight_refs(layer).items():
            if isinstance(ref.current, torch.Tensor):
                linears[ref.current.untyped_storage().data_ptr()] = (layer, linear, ref.current)
    out = {}
    for name, dest in model.weight_destinations().items():
        found = linears.get(dest.untyped_storage().data_ptr())
        if found is not None:
            layer, linear, whole = found
            out[name] = (layer, linear, (dest.data_ptr() - whole.data_ptr()) // (whole.stride(0) * whole.element_size()))
    return out
