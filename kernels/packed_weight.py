"""``PackedWeight``: an int8 / int4 / fp8 weight over its storage (the layouts: ``packed_formats.py``).

It satisfies the ``WeightRef`` contract (``linear(x, bias)``, ``nbytes``): on CUDA ``linear`` calls ``host_gemm``,
on the CPU the routes of ``packed_cpu_routes.py``. ``tensors()`` / ``with_tensors()`` let a placement move the
storage (host slab, staging slot) and rebuild the same weight over it.
"""
from __future__ import annotations

import torch

from gh200rt.kernels.packed_cpu_routes import CPU_ROUTES, PackedCpuRoutes
from gh200rt.kernels.packed_formats import unpack_int4


class PackedWeight(PackedCpuRoutes):
    """A quantized ``[N, K]`` weight (``packed_formats.py`` describes the layout)."""

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
            assert group_size == k, "fp8 weights carry one scale per output channel"
        else:
            assert qweight.dtype == torch.uint8 and qweight.shape == (n, (k + 1) // 2)
            assert minimum is not None and minimum.shape == (n, groups)
            assert group_size % 2 == 0, "both nibbles of a byte must share a group"
        self.fmt, self.qweight, self.scale, self.minimum = fmt, qweight, scale, minimum
        self.group_size, self.shape = group_size, (n, k)
        self.cpu_route, self.stable = cpu_route, stable
        self._cpu_int4: tuple[torch.Tensor, torch.Tensor] | None = None
        self._fbgemm = None
        self._bf16_scales: torch.Tensor | None = None
        self._native = None        # the native library's handle once checked, False when it does not apply
        self._native_args = None   # backends.cpu.native_args.QuantWeight: this weight's argument block

    @property
    def nbytes(self) -> int:
        parts = [self.qweight, self.scale] + ([self.minimum] if self.minimum is not None else [])
        if self._cpu_int4 is not None:
            parts += list(self._cpu_int4)
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
        if self.fmt == "fp8":
            return self.qweight.to(torch.float32) * self.scale
        q = self.qweight if self.fmt == "int8" else unpack_int4(self.qweight, k)
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
        if x.is_cuda:
            from gh200rt.kernels.host_gemm import host_gemm
            return host_gemm(x, self, bias)
        return self._linear_cpu(x, bias, native)

    def __repr__(self) -> str:
        return f"PackedWeight({self.fmt}, shape={self.shape}, group_size={self.group_size}, nbytes={self.nbytes})"
