"""host_gemm (Triton, interpreted here) against its torch reference for every weight format."""
import pytest
import torch

from gh200rt.kernels.host_gemm import host_gemm, reference_host_gemm
from gh200rt.kernels.quant import quantize_fp8, quantize_int4, quantize_int8

pytestmark = pytest.mark.interpreter

# (M, N, K): awkward on purpose; K = 129 / 257 leave one column past a BLOCK_K of 128 / 64 (M=1 / M>1 tiles)
SHAPES = [(1, 40, 72), (3, 33, 130), (17, 20, 64), (1, 64, 256), (1, 7, 129), (65, 5, 257)]


def make_weight(fmt, n, k, gen):
    w = torch.randn(n, k, generator=gen)
    if fmt == "int8":
        return quantize_int8(w)
    if fmt == "int8-group":
        return quantize_int8(w, group_size=32)
    if fmt == "int4":
        return quantize_int4(w, group_size=32)
    if fmt == "fp8":
        return quantize_fp8(w)
    return w.to(getattr(torch, fmt))


@pytest.mark.parametrize("fmt", ["float32", "bfloat16", "float16", "int8", "int8-group", "int4", "fp8"])
@pytest.mark.parametrize("m,n,k", SHAPES)
def test_host_gemm_matches_reference(fmt, m, n, k):
    gen = torch.Generator().manual_seed(m * 1000 + n + k)
    weight = make_weight(fmt, n, k, gen)
    x = torch.randn(m, k, generator=gen)
    bias = torch.randn(n, generator=gen) if m != 1 else None
    for split_k in (1, 2):
        got = host_gemm(x, weight, bias, split_k=split_k)
        want = reference_host_gemm(x, weight, bias)
        err = (got - want).abs().max().item()
        print(f"{fmt} M={m} N={n} K={k} split_k={split_k}: worst abs error {err:.2e}")
        assert got.shape == (m, n) and got.dtype == x.dtype
        assert err < 1e-4 * max(1.0, want.abs().max().item())


def test_bf16_activations_are_upcast():
    gen = torch.Generator().manual_seed(7)
    w = torch.randn(24, 48, generator=gen).bfloat16()
    x = torch.randn(2, 48, generator=gen).bfloat16()
    got = host_gemm(x, w).float()
    want = reference_host_gemm(x, w)
    err = (got - want).abs().max().item()
    print(f"bf16 x bf16: worst abs error {err:.2e} (bf16 output rounding)")
    assert err < 0.02 * want.abs().max().item()


def test_wrong_k_is_a_clear_error():
    with pytest.raises(ValueError, match="K=8"):
        host_gemm(torch.randn(1, 9), torch.randn(4, 8))
