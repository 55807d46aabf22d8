"""One layer's offloaded linear weights in their host forms, back to back in one exact-size slab.

``LayerSlab(forms, node, platform, device)`` lays the storage parts of every linear (``forms.py``)
out at 64-byte alignment, allocates the slab on ``node`` (``slabs.py``), fills it, and registers it
for DMA when the engine runs on a GPU. The same layout then rebuilds the weights over any buffer
holding those bytes: the slab itself, a staging slot (``bind(slot, stable=False)``), the slab as
the device reads it in place (``direct()``), or a device copy of the whole slab (``device_copy``),
which is how a layer becomes resident again with exactly the bits it streamed.
"""
from __future__ import annotations

import torch

from gh200rt.planner.cost_model import SLAB_ALIGN
from gh200rt.weights import forms as weight_forms
from gh200rt.weights.device_view import device_view, direct_weight, prepare_slab_for_device
from gh200rt.weights.slabs import allocate_slab

# (linear name, part name, shape, dtype, byte offset in the slab)
Layout = list[tuple[str, str, tuple, torch.dtype, int]]


def _layout(forms: dict[str, object]) -> tuple[Layout, int]:
    layout, offset = [], 0
    for name, form in forms.items():
        for part, tensor in weight_forms.storage_parts(form).items():
            offset = -(-offset // SLAB_ALIGN) * SLAB_ALIGN
            layout.append((name, part, tuple(tensor.shape), tensor.dtype, offset))
            offset += tensor.nbytes
    return layout, offset


class LayerSlab:
    def __init__(self, forms: dict[str, object], node: int, platform, device: torch.device):
        self.forms = forms
        self.layout, nbytes = _layout(forms)
        self.platform, self.device = platform, torch.device(device)
        self.buffer = allocate_slab(nbytes, node)
        for name, parts in self.views(self.buffer.tensor).items():
            for part, view in parts.items():
                view.copy_(weight_forms.storage_parts(forms[name])[part])
        if self.device.type != "cpu":  # a named profile may describe a GPU while the engine runs on the CPU
            prepare_slab_for_device(self.buffer, platform)
        self._direct: dict[str, object] | None = None

    @property
    def nbytes(self) -> int:
        return self.buffer.nbytes

    @property
    def tensor(self) -> torch.Tensor:
        """The slab's bytes on the host: what a staging copy reads."""
        return self.buffer.tensor

    def views(self, buffer: torch.Tensor) -> dict[str, dict[str, torch.Tensor]]:
        out: dict[str, dict[str, torch.Tensor]] = {}
        for name, part, shape, dtype, offset in self.layout:
            nbytes = torch.Size(shape).numel() * dtype.itemsize
            out.setdefault(name, {})[part] = buffer[offset:offset + nbytes].view(dtype).view(shape)
        return out

    def bind(self, buffer: torch.Tensor, compute_dtype: torch.dtype, stable: bool,
             wrap_dense=None) -> dict[str, object]:
        """Every linear of the layer rebuilt over ``buffer`` (``stable=False``: its bytes change between
        calls, as a staging slot's do, so nothing derived from them may be cached)."""
        return {name: weight_forms.bind(self.forms[name], views, compute_dtype, stable=stable, wrap_dense=wrap_dense)
                for name, views in self.views(buffer).items()}

    def direct(self, compute_dtype: torch.dtype) -> dict[str, object]:
        """The layer's weights read in place from the slab. Built once and kept, so what a packed weight
        derives from stable storage survives the layer's visits to the ring."""
        if self._direct is None:
            buffer = self.tensor if self.device.type == "cpu" else device_view(self.buffer, self.platform, self.device)
            self._direct = self.bind(buffer, compute_dtype, stable=True, wrap_dense=direct_weight)
        return self._direct

    def device_copy(self) -> torch.Tensor:
        """The slab's bytes copied into one new device buffer (a resident home)."""
        copy = torch.empty(self.nbytes, dtype=torch.uint8, device=self.device)
        copy.copy_(self.tensor)
        return copy

    def free(self) -> None:
        self._direct = None
        self.buffer.free()
