"""gemv (Triton, interpreted here) against its torch reference for every weight format, tile and ragged edge."""
import pytest
import torch

from gh200rt.kernels.triton.gemv import GEMV_TILE, gemv, reference_gemv
from tests.kernels.test_host_gemm import FORMATS, make_weight

pytestmark = pytest.mark.interpreter

# (N, K): N not a multiple of the tile, K past a whole tile by one column (or one int4 byte), K shorter than a tile
SHAPES = [(40, 72), (33, 130), (64, 256), (7, 129), (20, 1024), (5, 514)]


def check(x, weight, bias, tile, label):
    got = gemv(x, weight, bias, tile=tile)
    want = reference_gemv(x.reshape(1, -1), weight, bias).reshape(got.shape)
    err = (got - want).abs().max().item()
    assert got.shape == (*x.shape[:-1], weight.shape[0]) and got.dtype == x.dtype, label
    assert err < 1e-4 * max(1.0, want.abs().max().item()), f"{label}: worst abs error {err:.2e}"


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("n,k", SHAPES)
def test_gemv_matches_reference(fmt, n, k):
    gen = torch.Generator().manual_seed(n * 1000 + k)
    weight = make_weight(fmt, n, k, gen)
    x = torch.randn(1, k, generator=gen) + 0.5   # off zero: int4's minimum * sum(x) term is large
    bias = torch.randn(n, generator=gen)
    for tile, b in (((4, 64), bias), ((8, 256), None), (None, bias)):
        check(x, weight, b, tile, f"{fmt} N={n} K={k} tile={tile} bias={b is not None}")


def test_gemv_keeps_leading_shape_and_dtype():
    gen = torch.Generator().manual_seed(1)
    weight = torch.randn(24, 128, generator=gen).to(torch.bfloat16)
    x = torch.randn(1, 1, 128, generator=gen).to(torch.bfloat16)
    got = gemv(x, weight)
    assert got.shape == (1, 1, 24) and got.dtype == torch.bfloat16
    want = reference_gemv(x.reshape(1, 128), weight).reshape(1, 1, 24)
    assert (got.float() - want).abs().max() < 2e-2 * want.abs().max()


def test_gemv_refuses_wrong_width_and_several_rows():
    weight = torch.randn(8, 64)
    with pytest.raises(ValueError, match="K=64"):
        gemv(torch.randn(1, 32), weight)
    with pytest.raises(AssertionError, match="one row"):
        gemv(torch.randn(2, 64), weight)


def test_tile_gives_every_thread_whole_128_bit_loads():
    block_n, block_k = GEMV_TILE
    for bits in (4, 8, 16, 32):
        row_bytes = block_k * bits // 8
        assert row_bytes % 16 == 0 and block_n * row_bytes >= 128 * 16, (bits, block_n, block_k)


def unfused(x, weight, norm, gated, residual, tile):
    """The unfused kernels' way: RMSNorm, SiLU-mul, the product, the residual add (``fused_add_rmsnorm``'s sum)."""
    from gh200rt.kernels.triton.rmsnorm import fused_add_rmsnorm
    from gh200rt.kernels.triton.silu_mul import silu_mul
    if norm is not None:
        x, _ = fused_add_rmsnorm(x, None, norm[0], norm[1])
    if gated:
        x = silu_mul(x)
    y = gemv(x, weight, tile=tile)
    if residual is not None:
        _, y = fused_add_rmsnorm(y, residual, torch.ones(y.shape[-1], dtype=y.dtype), 1e-5)
    return y


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("fmt", ["dense", "int8"])
@pytest.mark.parametrize("fusion", ["norm", "gated", "residual", "norm+residual", "gated+residual"])
def test_fused_prologue_and_residual_match_the_unfused_kernels(dtype, fmt, fusion):
    """A decode layer's products with the RMSNorm before, the SiLU-mul before or the residual add after fused into
    the launch give the unfused kernels' bits (each rounds where those store), at a K that ends inside a tile
    and an N that ends inside one; in float32 also the torch reference's values."""
    from gh200rt.kernels.triton.gemv import reference_fused_gemv
    gen = torch.Generator().manual_seed(len(fusion) * 7 + (fmt == "int8"))
    n, k = 37, 200
    weight = (torch.randn(n, k, generator=gen) * 0.1).to(dtype) if fmt == "dense" else make_weight("int8", n, k, gen)
    gated = "gated" in fusion
    x = (torch.randn(1, 2 * k if gated else k, generator=gen) * 2).to(dtype)
    norm = ((1 + 0.1 * torch.randn(k, generator=gen)).to(dtype), 1e-5) if "norm" in fusion else None
    residual = torch.randn(1, n, generator=gen).to(dtype) if "residual" in fusion else None
    got = gemv(x, weight, norm=norm, gated=gated, residual=residual, tile=(8, 64))
    assert got.shape == (1, n) and got.dtype == dtype
    assert torch.equal(got, unfused(x, weight, norm, gated, residual, (8, 64))), fusion
    if dtype == torch.float32:   # the interpreter rounds to bfloat16 its own way: bits against the kernels only
        want = reference_fused_gemv(x, weight, norm=norm, gated=gated, residual=residual)
        assert (got - want).abs().max().item() <= 1e-4 * want.abs().max().item(), fusion


def test_a_gated_row_must_hold_gate_and_up():
    with pytest.raises(ValueError, match="gate\\|up row of 2K"):
        gemv(torch.randn(1, 64), torch.randn(8, 64), gated=True)
