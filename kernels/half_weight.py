"""``HalfWeight``, the ``fp16`` host format (a dense weight rounded to float16), and whether fbgemm's fp16 GEMM
runs here.

Activations keep their dtype; the class docstring gives the route each device and row count takes.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

# Row counts up to which float32 activations against an fp16 weight go through the native fp16 linear
# (kernels/cpu/f16_linear.c) instead of fbgemm's fp16 GEMM: a decode step of a few sequences, where the two cost
# about the same per linear and the native one lets the whole decoder layer run in one native call
# (backends/cpu/decode_layer.py; docs/benchmarks/kernels.md).
NATIVE_F16_MAX_ROWS = 8


class HalfWeight:
    """A dense ``[N, K]`` weight stored in float16 (``fp16`` host format); activations keep their dtype.

    CUDA: ``host_gemm`` reads the fp16 tensor in place. CPU, float32 activations: up to
    ``NATIVE_F16_MAX_ROWS`` rows the native fp16 linear reads the tensor in place (with the native CPU
    kernels built and ``native``: off for ``--cpu-kernels torch``); more rows fbgemm's fp16 GEMM (float32
    accumulation, fp16 weights widened in registers: ~2x the fp32 GEMM at decode, and exact for the fp16
    weight) over fbgemm's packed copy of the weight, built at first use when ``stable`` and on every call
    otherwise (~80x a decode GEMM: correct, not fast); without fbgemm, the weight is widened to the
    activation dtype on every call.
    """
    fmt = "fp16"

    def __init__(self, weight: torch.Tensor, stable: bool = True):
        assert weight.dtype == torch.float16 and weight.dim() == 2, (weight.dtype, weight.shape)
        self.weight, self.stable = weight, stable
        self.shape = tuple(weight.shape)
        self._fbgemm = None
        self._native = None   # the native ops when they take this weight, False when not (decided once)

    @property
    def nbytes(self) -> int:
        # fbgemm's packed copy is opaque; it holds the same fp16 values (plus tile padding).
        return self.weight.nbytes * (2 if self._fbgemm is not None else 1)

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
        if x.is_cuda:
            from gh200rt.kernels.host_gemm import host_gemm
            return host_gemm(x, self.weight, bias)
        ops = self.native_ops() if native else None
        if ops is not None and x.dtype == torch.float32 and 0 < x.numel() <= NATIVE_F16_MAX_ROWS * self.shape[1] \
                and (bias is None or (bias.dtype == torch.float32 and bias.is_cpu)):
            return ops.f16_linear_checked(x, self.weight, bias)
        if x.dtype != torch.float32 or x.numel() == 0 or not fbgemm_fp16_available():
            return F.linear(x, self.weight.to(x.dtype), None if bias is None else bias.to(x.dtype))
        y = torch.ops.quantized.linear_dynamic_fp16(x.reshape(-1, self.shape[1]), self._fbgemm_form())
        if bias is not None:
            y = y + bias
        return y.reshape(*x.shape[:-1], self.shape[0])

    def native_ops(self):
        """The native CPU ops when they take this weight (a CPU tensor with unit column stride), else None."""
        if self._native is None:
            from gh200rt.backends.cpu.native import load_native_ops
            ops = load_native_ops() if self.weight.is_cpu and self.weight.stride(-1) == 1 else None
            self._native = ops if ops is not None else False
        return self._native or None

    def _fbgemm_form(self):
        if self._fbgemm is not None:
            return self._fbgemm
        packed = torch.ops.quantized.linear_prepack_fp16(self.weight, None)
        if self.stable:
            self._fbgemm = packed
        return packed

    def __repr__(self) -> str:
        return f"HalfWeight(shape={self.shape}, stable={self.stable}, nbytes={self.nbytes})"


_fbgemm_fp16_ok: bool | None = None  # None: not probed yet


def fbgemm_fp16_available() -> bool:
    """Whether torch's fbgemm fp16 GEMM runs here and agrees with F.linear (probed once per process)."""
    global _fbgemm_fp16_ok
    if _fbgemm_fp16_ok is None:
        gen = torch.Generator().manual_seed(0)
        w, x = torch.randn(24, 40, generator=gen).half(), torch.randn(3, 40, generator=gen)
        try:
            y = torch.ops.quantized.linear_dynamic_fp16(x, torch.ops.quantized.linear_prepack_fp16(w, None))
            _fbgemm_fp16_ok = torch.allclose(y, F.linear(x, w.float()), rtol=1e-5, atol=1e-5)
        except (AttributeError, NotImplementedError, RuntimeError):
            _fbgemm_fp16_ok = False
    return _fbgemm_fp16_ok
