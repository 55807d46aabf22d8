"""One layer's offloaded linear weights in their host forms, back to back in one exact-size slab.

``LayerSlab(forms, node, platform, device)`` lays the storage parts of every linear (``forms.py``)
out at 64-byte alignment (``WeightLayout``, also what an arena run holds), allocates the slab on
``node`` (``slabs.py``), fills it, and registers it for DMA when the engine runs on a GPU. The same layout then rebuilds the weights over any buffer
holding those bytes: the slab itself, a staging slot (``bind(slot, stable=False)``), the slab as
the device reads it in place (``direct()``), or a device copy of the whole slab (``device_copy``),
which is how a layer becomes resident again with exactly the bits it streamed.
"""
from __future__ import annotations

import torch

from gh200rt.formats.packed_weight import PackedWeight
from gh200rt.planner.cost_model import SLAB_ALIGN
from gh200rt.weights import forms as weight_forms
from gh200rt.weights.device_view import device_view, direct_weight, prepare_slab_for_device
from gh200rt.weights.slabs import allocate_slab

# (linear name, part name, shape, dtype, byte offset)
Layout = list[tuple[str, str, tuple, torch.dtype, int]]


def meta_form(form):
    """``form`` over storage-free (meta) tensors of the same shapes and dtypes."""
    if isinstance(form, torch.Tensor):
        return torch.empty_like(form, device="meta")
    return form.with_tensors({k: torch.empty_like(t, device="meta") for k, t in form.tensors().items()},
                             stable=False)


class WeightLayout:
    """Every linear of a layer, in ``forms`` (name -> dense tensor or packed weight), laid out back to back
    at 64-byte alignment: where each storage part sits in one buffer, and the weights rebuilt over one."""

    def __init__(self, forms: dict[str, object]):
        self.forms = forms
        self.parts: Layout = []
        offset = 0
        for name, form in forms.items():
            for part, tensor in weight_forms.storage_parts(form).items():
                offset = -(-offset // SLAB_ALIGN) * SLAB_ALIGN
                self.parts.append((name, part, tuple(tensor.shape), tensor.dtype, offset))
                offset += tensor.nbytes
        self.nbytes = offset

    def views(self, buffer: torch.Tensor) -> dict[str, dict[str, torch.Tensor]]:
        out: dict[str, dict[str, torch.Tensor]] = {}
        for name, part, shape, dtype, offset in self.parts:
            nbytes = torch.Size(shape).numel() * dtype.itemsize
            out.setdefault(name, {})[part] = buffer[offset:offset + nbytes].view(dtype).view(shape)
        return out

    def fill(self, buffer: torch.Tensor) -> None:
        """Copy every part of ``forms`` to its place in ``buffer``, then let go of the sources: from here on
        the layout keeps only shapes and dtypes (binding needs no more), so the originals can be freed."""
        for name, parts in self.views(buffer).items():
            for part, view in parts.items():
                view.copy_(weight_forms.storage_parts(self.forms[name])[part])
        self.forms = {name: meta_form(form) for name, form in self.forms.items()}

    def bind(self, buffer: torch.Tensor, compute_dtype: torch.dtype, stable: bool,
             wrap_dense=None) -> dict[str, object]:
        """Every linear rebuilt over ``buffer`` (``stable=False``: its bytes change between calls, as a
        staging slot's do, so nothing derived from them may be cached)."""
        return {name: weight_forms.bind(self.forms[name], views, compute_dtype, stable=stable, wrap_dense=wrap_dense)
                for name, views in self.views(buffer).items()}


class LayerSlab:
    def __init__(self, forms: dict[str, object], node: int, platform, device: torch.device):
        self.layout = WeightLayout(forms)
        self.platform, self.device = platform, torch.device(device)
        self.buffer = allocate_slab(self.layout.nbytes, node)
        self.layout.fill(self.buffer.tensor)
        if self.device.type != "cpu":  # a named profile may describe a GPU while the engine runs on the CPU
            prepare_slab_for_device(self.buffer, platform)
        self._direct: dict[str, object] | None = None

    @classmethod
    def from_cache(cls, forms: dict[str, object], node: int, platform, device: torch.device, cache,
                   name: str, workers: int = 1) -> "LayerSlab | None":
        """The slab ``forms`` (storage-free: meta tensors) lay out, its bytes read from ``cache`` (a
        ``SlabCache``) under ``name`` on ``workers`` threads; None, with nothing kept, when the cache does not
        hold them."""
        layout = WeightLayout(forms)
        buffer = allocate_slab(layout.nbytes, node, touch=False)   # the read's writes place the pages
        if not cache.read(name, layout, buffer.tensor[:layout.nbytes], workers):
            buffer.free()
            return None
        slab = cls.__new__(cls)
        slab.layout, slab.platform, slab.device, slab.buffer = layout, platform, torch.device(device), buffer
        if slab.device.type != "cpu":
            prepare_slab_for_device(buffer, platform)
        slab._direct = None
        return slab

    @property
    def nbytes(self) -> int:
        return self.buffer.nbytes

    @property
    def tensor(self) -> torch.Tensor:
        """The slab's bytes on the host: what a staging copy reads."""
        return self.buffer.tensor

    def bind(self, buffer: torch.Tensor, compute_dtype: torch.dtype, stable: bool,
             wrap_dense=None) -> dict[str, object]:
        return self.layout.bind(buffer, compute_dtype, stable, wrap_dense)

    def direct(self, compute_dtype: torch.dtype, scales_on_device: bool = False) -> dict[str, object]:
        """The layer's weights read in place from the slab. Built once and kept, so what a packed weight
        derives from stable storage survives the layer's visits to the ring. ``scales_on_device`` (a GPU): each
        packed weight's scales (and int4 minimums) copied into device memory, its codes still read in place;
        ``forget_direct`` lets the copies go."""
        on_gpu = self.device.type != "cpu"
        if self._direct is None:
            buffer = device_view(self.buffer, self.platform, self.device) if on_gpu else self.tensor
            weights = self.bind(buffer, compute_dtype, stable=True, wrap_dense=direct_weight)
            if scales_on_device and on_gpu:
                weights = {name: _scales_copied(weight) for name, weight in weights.items()}
            self._direct, self._direct_scales = weights, scales_on_device and on_gpu
        assert self._direct_scales == (scales_on_device and on_gpu), "a slab's direct weights keep one scale placement"
        return self._direct

    def scale_bytes(self) -> int:
        """Bytes of the packed weights' scales and minimums (what ``direct(scales_on_device=True)`` copies)."""
        return sum(torch.Size(shape).numel() * dtype.itemsize for _, part, shape, dtype, _ in self.layout.parts
                   if part in SCALE_PARTS)

    def forget_direct(self) -> None:
        """Drop the direct weights (and device copies of their scales) until ``direct`` is asked again."""
        self._direct = None

    def device_copy(self, into: torch.Tensor | None = None) -> torch.Tensor:
        """The slab's bytes copied into ``into`` (device bytes, e.g. an arena run) or one new device buffer:
        a resident home holding exactly the bits the layer streamed."""
        copy = torch.empty(self.nbytes, dtype=torch.uint8, device=self.device) if into is None else \
            into[:self.nbytes]
        copy.copy_(self.tensor)
        return copy

    def free(self) -> None:
        self._direct = None
        self.buffer.free()


SCALE_PARTS = ("scale", "minimum")   # a PackedWeight's storage parts besides its codes


def _scales_copied(weight):
    """A packed weight read in place with its scale parts copied into device memory; anything else as it is."""
    if not isinstance(weight, PackedWeight):
        return weight
    tensors = weight.tensors()
    return weight.with_tensors({name: t.clone() if name in SCALE_PARTS else t for name, t in tensors.items()})
