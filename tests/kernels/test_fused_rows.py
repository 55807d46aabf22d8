"""fused_rows (Triton, interpreted here) against its torch reference: a decode layer's products at 1-64 rows with
the RMSNorm or SiLU-and-mul before and the residual add after fused into the launch, at ragged rows, channels and
K, in both 16-bit dtypes."""
import pytest
import torch

from gh200rt.kernels.triton.fused_rows import MAX_ROWS, block_rows, fused_rows, reference_fused_rows

pytestmark = pytest.mark.interpreter

# the interpreter rounds to 16 bits its own way (truncating) at up to three points (the prologue, the product before the
# residual add, the output), and the product sums in another order: a few units of the last place at the largest
# output (bfloat16 holds 8 bits; a lost norm weight, SiLU or residual is off by 10-100%)
TOLERANCE = {torch.bfloat16: 2 ** -5, torch.float16: 2 ** -8}


def operands(rows: int, n: int, k: int, fusion: str, dtype, seed: int):
    gen = torch.Generator().manual_seed(seed)
    gated = "gated" in fusion
    weight = (torch.randn(n, k, generator=gen) * 0.1).to(dtype)
    x = (torch.randn(rows, 2 * k if gated else k, generator=gen) * 2).to(dtype)
    norm = ((1 + 0.1 * torch.randn(k, generator=gen)).to(dtype), 1e-5) if "norm" in fusion else None
    residual = torch.randn(rows, n, generator=gen).to(dtype) if "residual" in fusion else None
    bias = torch.randn(n, generator=gen).to(dtype) if "bias" in fusion else None
    return x, weight, bias, dict(norm=norm, gated=gated, residual=residual)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("fusion", ["none", "bias", "norm+bias", "norm", "gated", "residual", "gated+residual"])
@pytest.mark.parametrize("rows,n,k", [(3, 37, 200), (8, 40, 512), (17, 24, 300), (2, 16, 256)])
def test_fused_rows_match_the_reference(dtype, fusion, rows, n, k):
    x, weight, bias, fused = operands(rows, n, k, fusion, dtype, seed=rows * 31 + len(fusion))
    got = fused_rows(x, weight, bias, tile=dict(BLOCK_N=16, BLOCK_K=64), **fused)
    want = reference_fused_rows(x, weight, bias, **fused)
    assert got.shape == (rows, n) and got.dtype == dtype
    err = (got.float() - want.float()).abs().max().item() / want.float().abs().max().item()
    assert err <= TOLERANCE[dtype], f"{fusion}: worst relative error {err:.2e}"


@pytest.mark.parametrize("fusion", ["norm", "gated+residual", "none"])
def test_the_16_bit_dot_matches_the_reference(fusion):
    """``DOT_16BIT`` multiplies the 16-bit values themselves (fp16 here: the interpreter's bf16 dot is not a GPU's;
    tests/gpu/test_gpu_fused_rows.py runs bf16 compiled)."""
    x, weight, bias, fused = operands(8, 40, 512, fusion, torch.float16, seed=11)
    got = fused_rows(x, weight, bias, tile=dict(BLOCK_N=16, BLOCK_K=64, DOT_16BIT=True), **fused)
    want = reference_fused_rows(x, weight, bias, **fused)
    assert (got.float() - want.float()).abs().max() <= TOLERANCE[torch.float16] * want.float().abs().max()


def test_the_default_tile_and_the_largest_row_count():
    x, weight, bias, fused = operands(MAX_ROWS, 20, 512, "norm", torch.bfloat16, seed=1)
    got = fused_rows(x, weight, **fused)
    want = reference_fused_rows(x, weight, **fused)
    assert (got.float() - want.float()).abs().max() <= TOLERANCE[torch.bfloat16] * want.float().abs().max()
    assert [block_rows(m) for m in (1, 2, 8, 16, 17, 64)] == [16, 16, 16, 16, 32, 64]


def test_rows_must_be_as_wide_as_the_weight_expects():
    with pytest.raises(ValueError, match="gate\\|up rows of 2K"):
        fused_rows(torch.randn(2, 64, dtype=torch.bfloat16), torch.randn(8, 64, dtype=torch.bfloat16), gated=True)
