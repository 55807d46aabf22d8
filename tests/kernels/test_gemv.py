"""gemv (Triton, interpreted here) against its torch reference for every weight format, tile and ragged edge."""
import pytest
import torch

from gh200rt.kernels.gemv import GEMV_TILE, gemv, reference_gemv
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
