"""``HalfWeight``, the ``fp16`` host format: a dense weight rounded to float16.

Activations keep their dtype; the backend of their device multiplies (``backends/cpu/half_linear.py``,
``backends/cuda/format_linear.py``).
"""
from __future__ import annotations

import torch

from gh200rt.formats.backend_linear import backend_linear


class HalfWeight:
    """A dense ``[N, K]`` weight stored in float16 (``fp16`` host format); activations keep their dtype.

    CUDA: ``host_gemm`` reads the fp16 tensor in place. CPU: the native fp16 linear for a few rows, else fbgemm's
    fp16 GEMM over its packed copy of the weight (``backends/cpu/half_linear.py``), kept in ``derived`` when
    ``stable``.
    """
    fmt = "fp16"

    def __init__(self, weight: torch.Tensor, stable: bool = True):
        assert weight.dtype == torch.float16 and weight.dim() == 2, (weight.dtype, weight.shape)
        self.weight, self.stable = weight, stable
        self.shape = tuple(weight.shape)
        self.derived: dict[str, object] = {}   # what a backend derives from the weight and keeps, by name

    @property
    def nbytes(self) -> int:
        # fbgemm's packed copy is opaque; it holds the same fp16 values (plus tile padding).
        return self.weight.nbytes * (2 if "fbgemm" in self.derived else 1)

    @property
    def device(self) -> torch.device:
        return self.weight.device

    def tensors(self) -> dict[str, torch.Tensor]:
        return {"weight": self.weight}

    def with_tensors(self, tensors: dict[str, torch.Tensor], stable: bool = True) -> "HalfWeight":
        return HalfWeight(tensors["weight"], stable)

    def dequantize(self) -> torch.Tensor:
        return self.weight.to(torch.float32)

    def linear(self, x: torch.Tensor, bias: torch.Tensor | None = None, native: bool = True) -> torch.Tensor:
        """``native``: on the CPU, whether the native fp16 linear may serve (off: ``--cpu-kernels torch``)."""
        return backend_linear(x.device.type, "half").linear(self, x, bias, native)

    def __repr__(self) -> str:
        return f"HalfWeight(shape={self.shape}, stable={self.stable}, nbytes={self.nbytes})"
