"""On CUDA: packed weights go through host_gemm, and host_gemm reads host-resident weights in place.

Marked ``gpu``: skipped here, run by the GPU test matrix (scripts/validate_gpu.py).
"""
import pytest
import torch

from gh200rt.formats.pack import quantize_fp8, quantize_int4, quantize_int8
from gh200rt.kernels.triton import host_gemm as host_gemm_module
from gh200rt.kernels.triton.host_gemm import host_gemm
from gh200rt.kernels.triton.weight_operands import reference_host_gemm

pytestmark = pytest.mark.gpu

# M > 1 uses tensor cores in TF32 on the GPU; M = 1 is exact float32 FMA.
TOLERANCE = {1: 1e-4, 8: 5e-3, 100: 5e-3}


def packed_on(device, fmt, n, k):
    w = torch.randn(n, k)
    packed = {"int8": quantize_int8, "int8-g32": lambda t: quantize_int8(t, 32), "fp8": quantize_fp8,
              "int4": lambda t: quantize_int4(t, 32), "int4-g128": lambda t: quantize_int4(t, 128)}[fmt](w)
    move = (lambda t: t.pin_memory()) if device == "host" else (lambda t: t.cuda())
    return packed.with_tensors({name: move(t) for name, t in packed.tensors().items()})


@pytest.mark.parametrize("fmt", ["int8", "int8-g32", "int4", "int4-g128", "fp8"])
@pytest.mark.parametrize("m", [1, 8, 100])
def test_packed_linear_calls_host_gemm_on_cuda(monkeypatch, fmt, m):
    calls = []
    real = host_gemm_module.host_gemm
    monkeypatch.setattr(host_gemm_module, "host_gemm", lambda *a, **k: calls.append(1) or real(*a, **k))
    packed = packed_on("device", fmt, 320, 576)
    x = torch.randn(m, 576, device="cuda")
    y = packed.linear(x)
    want = reference_host_gemm(x, packed)
    err = ((y - want).abs().max() / want.abs().max()).item()
    print(f"{fmt} M={m} on CUDA: worst relative error {err:.2e}")
    assert calls and y.is_cuda and err < TOLERANCE[m]


@pytest.mark.parametrize("fmt", ["bf16", "int8", "int8-g32", "int4", "int4-g128", "fp8"])
def test_direct_read_of_pinned_host_weights(fmt):
    """The DIRECT tier: weights stay in pinned host memory and the kernel loads them over the link."""
    if fmt == "bf16":
        weight = torch.randn(576, 1536).bfloat16().pin_memory()
    else:
        weight = packed_on("host", fmt, 576, 1536)
    x = torch.randn(1, 1536, device="cuda", dtype=torch.bfloat16)
    y = host_gemm(x, weight)
    dense = weight if fmt == "bf16" else weight.dequantize()
    want = x.float() @ dense.cuda().float().T
    err = ((y.float() - want).abs().max() / want.abs().max()).item()
    print(f"direct {fmt}: worst relative error {err:.2e}")
    assert err < 1e-2  # bf16 output rounding
