"""``PackedWeight``: an int8 / int4 / fp8 weight over its storage (the layouts: ``packed_layout.py``).

It satisfies the ``WeightRef`` contract (``linear(x, bias)``, ``nbytes``): ``linear`` is the backend's of ``x``'s
device (``backend_linear.py``: on CUDA ``host_gemm``, on the CPU the routes of ``backends/cpu/packed_linear.py``).
``tensors()`` / ``with_tensors()`` let a placement move the storage (host slab, staging slot) and rebuild the same
weight over it. ``derived`` holds what a backend derives from the storage and keeps (torch's int4 layout, an fbgemm
packed matrix, the native library's argument block), by name; a weight whose storage changes between calls
(``stable=False``) keeps none of the storage-derived ones.
"""
from __future__ import annotations

import torch

from gh200rt.formats.backend_linear import backend_linear
from gh200rt.formats.packed_layout import unpack_int4

# How the CPU multiplies an int8 weight: exactly (the native quantized linear, torch's weight-only ops), or through
# fbgemm's dynamic int8 linear, which also quantizes activations (faster, less accurate: a comparison point).
CPU_ROUTES = ("exact", "fbgemm")


class PackedWeight:
    """A quantized ``[N, K]`` weight (``packed_layout.py`` describes the layout)."""

    def __init__(self, fmt: str, qweight: torch.Tensor, scale: torch.Tensor,
                 minimum: torch.Tensor | None, group_size: int, shape: tuple[int, int], cpu_route: str = "exact",
                 stable: bool = True):
        assert fmt in ("int8", "int4", "fp8"), fmt
        if cpu_route not in CPU_ROUTES:
            raise ValueError(f"cpu_route {cpu_route!r}: choose one of {', '.join(CPU_ROUTES)}")
        n, k = shape
        groups = -(-k // group_size)
        assert scale.shape == (n, groups) and scale.dtype == torch.float32, (scale.shape, scale.dtype)
        if fmt == "int8":
            assert qweight.dtype == torch.int8 and qweight.shape == (n, k) and minimum is None
        elif fmt == "fp8":
            assert qweight.dtype == torch.float8_e4m3fn and qweight.shape == (n, k) and minimum is None
        else:
            assert qweight.dtype == torch.uint8 and qweight.shape == (n, (k + 1) // 2)
            assert minimum is not None and minimum.shape == (n, groups)
            assert group_size % 2 == 0, "both nibbles of a byte must share a group"
        self.fmt, self.qweight, self.scale, self.minimum = fmt, qweight, scale, minimum
        self.group_size, self.shape = group_size, (n, k)
        self.cpu_route, self.stable = cpu_route, stable
        self.derived: dict[str, object] = {}

    @property
    def nbytes(self) -> int:
        parts = [self.qweight, self.scale] + ([self.minimum] if self.minimum is not None else [])
        parts += list(self.derived.get("cpu_int4", ())) + list(self.derived.get("widened_codes", ()))
        return sum(t.nbytes for t in parts)

    @property
    def device(self) -> torch.device:
        return self.qweight.device

    def tensors(self) -> dict[str, torch.Tensor]:
        """The storage a placement moves (host slab, staging slot): ``qweight``, ``scale`` [, ``minimum``]."""
        out = {"qweight": self.qweight, "scale": self.scale}
        if self.minimum is not None:
            out["minimum"] = self.minimum
        return out

    def with_tensors(self, tensors: dict[str, torch.Tensor], stable: bool = True) -> "PackedWeight":
        """The same weight over other storage (e.g. views into a slab or a slot), same shapes and dtypes.
        ``stable=False``: the storage's contents change between calls; cache nothing derived from it."""
        return PackedWeight(self.fmt, tensors["qweight"], tensors["scale"], tensors.get("minimum"),
                            self.group_size, self.shape, self.cpu_route, stable)

    def dequantize(self) -> torch.Tensor:
        """The dense float32 ``[N, K]`` weight."""
        n, k = self.shape
        if self.fmt == "fp8" and self.group_size >= k:
            return self.qweight.to(torch.float32) * self.scale
        q = self.qweight.to(torch.float32) if self.fmt == "fp8" else \
            self.qweight if self.fmt == "int8" else unpack_int4(self.qweight, k)
        if k % self.group_size == 0:  # scales broadcast over their group: one pass, no expanded copies
            w = q.view(n, -1, self.group_size) * self.scale[..., None]
            if self.minimum is not None:
                w += self.minimum[..., None]
            return w.view(n, k)
        w = q.to(torch.float32) * self.scale.repeat_interleave(self.group_size, dim=1)[:, :k]
        if self.minimum is not None:
            w += self.minimum.repeat_interleave(self.group_size, dim=1)[:, :k]
        return w

    def linear(self, x: torch.Tensor, bias: torch.Tensor | None = None, native: bool = True) -> torch.Tensor:
        """``native``: on the CPU, whether the native quantized linear may serve (off: torch's ops alone)."""
        return backend_linear(x.device.type, "packed").linear(self, x, bias, native)

    def dense_for(self, x: torch.Tensor, native: bool = True) -> torch.Tensor | None:
        """The dense weight a layer multiplies ``x`` by instead, where the backend has no faster exact route (fp8
        with float32 activations on the CPU, beyond the rows its native fp8 linear takes: ``native`` as for
        ``linear``), else None."""
        return backend_linear(x.device.type, "packed").dense_for(self, x, native)

    def block_form(self, x: torch.Tensor, rows: int, native: bool = True):
        """What each block of ``rows`` rows of ``x`` multiplies when a call runs in row blocks
        (models/layers/row_blocks.py): this weight, or its dense form made once for the whole call."""
        return backend_linear(x.device.type, "packed").block_form(self, x, rows, native)

    def __repr__(self) -> str:
        return f"PackedWeight({self.fmt}, shape={self.shape}, group_size={self.group_size}, nbytes={self.nbytes})"


def concat_rows(parts: list[PackedWeight]) -> PackedWeight:
    """One packed weight stacking ``parts`` along the output dimension (a fused qkv or gate_up)."""
    first = parts[0]
    if any(p.fmt != first.fmt or p.group_size != first.group_size or p.shape[1] != first.shape[1] for p in parts):
        raise ValueError("cannot fuse packed weights of different formats or group sizes: "
                         + ", ".join(repr(p) for p in parts))
    tensors = {name: torch.cat([p.tensors()[name] for p in parts]) for name in first.tensors()}
    rows = sum(p.shape[0] for p in parts)
    return PackedWeight(first.fmt, tensors["qweight"], tensors["scale"], tensors.get("minimum"),
                        first.group_size, (rows, first.shape[1]))
