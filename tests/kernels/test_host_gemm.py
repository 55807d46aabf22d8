"""host_gemm (Triton, interpreted here) against its torch reference for every weight format and scale route."""
import pytest
import torch

from gh200rt.formats.pack import quantize_fp8, quantize_int4, quantize_int8
from gh200rt.formats.quantizers import fp8_blocks_from_checkpoint
from gh200rt.kernels.triton.host_gemm import (MIN_ROW_BYTES, MIN_TILE_BYTES, PER_CHANNEL, PER_ELEMENT, PER_TILE,
                                              host_gemm, scale_mode, tile_config)
from gh200rt.kernels.triton.weight_operands import FMT_INT4, FMT_SCALED, reference_host_gemm
from tests.model.fp8_block_checkpoint import quantize_blocks

pytestmark = pytest.mark.interpreter

# (M, N, K): awkward on purpose; K = 129 / 257 leave one column past a BLOCK_K of 128 / 64 (M=1 / M>1 tiles)
SHAPES = [(1, 40, 72), (3, 33, 130), (17, 20, 64), (1, 64, 256), (1, 7, 129), (65, 5, 257)]
# every weight the quantizer makes: per channel, groups a K tile fits inside, and groups it cannot (48: not a
# power of two; int4 g16: 8 bytes a row, less than a 128-bit load), which take the per-element route
FORMATS = ["float32", "bfloat16", "float16", "int8", "int8-g32", "int8-g64", "int8-g48", "fp8", "fp8-b32", "fp8-b128",
           "int4-g32", "int4-g64", "int4-g128", "int4-g16", "int4-channel"]


def make_weight(fmt, n, k, gen):
    w = torch.randn(n, k, generator=gen)
    kind, _, group = fmt.partition("-g")
    if kind == "int8":
        return quantize_int8(w, group_size=int(group) if group else None)
    if kind == "int4-channel":   # one group spanning K (int4 groups hold whole bytes: an even size)
        return quantize_int4(w, group_size=k + k % 2)
    if kind == "int4":
        return quantize_int4(w, group_size=int(group))
    if kind == "fp8":
        return quantize_fp8(w)
    if kind == "fp8-b32" or kind == "fp8-b128":   # a block-FP8 checkpoint's weight: blocks of 16 rows x 32 / 128
        block = (16, int(kind.removeprefix("fp8-b")))
        return fp8_blocks_from_checkpoint(*quantize_blocks(w, block), block)
    return w.to(getattr(torch, fmt))


def check(x, weight, bias, split_k, label):
    got = host_gemm(x, weight, bias, split_k=split_k)
    want = reference_host_gemm(x, weight, bias)
    err = (got - want).abs().max().item()
    print(f"{label} split_k={split_k}: worst abs error {err:.2e}")
    assert got.shape == want.shape and got.dtype == x.dtype
    assert err < 1e-4 * max(1.0, want.abs().max().item()), f"{label} split_k={split_k}: worst abs error {err:.2e}"


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("m,n,k", SHAPES)
def test_host_gemm_matches_reference(fmt, m, n, k):
    gen = torch.Generator().manual_seed(m * 1000 + n + k)
    weight = make_weight(fmt, n, k, gen)
    x = torch.randn(m, k, generator=gen)
    bias = torch.randn(n, generator=gen) if m != 1 else None
    for split_k in (1, 2):
        check(x, weight, bias, split_k, f"{fmt} M={m} N={n} K={k}")


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("m", [1, 3, 8, 64])
def test_splits_and_tiles(fmt, m):
    """Splits of K that are not whole multiples of it (456 = 14.25 groups of 32, 3.6 of 128) at every tile shape,
    with a bias; x is off zero so int4's ``minimum * sum(x)`` term is large and a wrong column sum shows."""
    n, k = 40, 456
    gen = torch.Generator().manual_seed(len(fmt) * 100 + m)
    weight = make_weight(fmt, n, k, gen)
    x = torch.randn(m, k, generator=gen) + 0.5
    bias = torch.randn(n, generator=gen)
    for split_k in (1, 3, 5):
        check(x, weight, bias, split_k, f"{fmt} M={m} N={n} K={k}")


@pytest.mark.parametrize("group,bits,route", [(4096, 8, PER_CHANNEL), (32, 8, PER_ELEMENT), (128, 8, PER_TILE),
                                              (32, 4, PER_ELEMENT), (64, 4, PER_ELEMENT), (128, 4, PER_TILE),
                                              (256, 4, PER_TILE), (48, 8, PER_ELEMENT), (16, 4, PER_ELEMENT)])
def test_scales_are_loaded_per_channel_or_tile_where_groups_allow(group, bits, route):
    """A Llama-sized K: per-channel scales apply once, power-of-two groups of 128+ once per K tile (narrower ones
    per element: K tiles shrunk to 32 measured slower on an H100), and those tiles keep
    128-bit weight loads (a tile that straddled groups, or shrank below a load per thread, would be wrong or slow)."""
    fmt = FMT_INT4 if bits == 4 else FMT_SCALED
    chosen = scale_mode(fmt, group, 4096, bits)
    assert chosen == route, (group, bits, chosen, route)
    if chosen != PER_TILE:
        return
    for m in (1, 8, 64):
        cfg = tile_config(m, bits, group)
        row_bytes = cfg["BLOCK_K"] * bits // 8
        assert group % cfg["BLOCK_K"] == 0 and row_bytes >= MIN_ROW_BYTES, (m, cfg)
        assert cfg["BLOCK_N"] * row_bytes >= MIN_TILE_BYTES, (m, cfg)


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
