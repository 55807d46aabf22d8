"""The native tiled bf16 linears against torch — AMX (kernels/cpu/amx_linear.c) and AVX-512 BF16 dot products
(kernels/cpu/bf16_dot_linear.c) over the same packed weight — and the contract the bf16 route relies on: a row's bits
depend on that row and the weight alone, not on the call's row count nor the thread count. Each kernel runs where
this build and CPU have it (AMX: Sapphire Rapids and later; the dot products: AVX-512 BF16, Zen 4 and those Xeons);
elsewhere the build must say it has none."""
from __future__ import annotations

import platform

import pytest
import torch

from gh200rt.backends.cpu.native import load_native_ops, native_ops_error
from tests.kernels.native_builds import native_ops_for
from tests.kernels.threads import with_threads

OPS = load_native_ops()
pytestmark = pytest.mark.skipif(OPS is None, reason=f"native CPU ops unavailable: {native_ops_error()}")
KERNELS = {"amx": ("amx_available", "amx_linear"), "dot": ("bf16_dot_available", "bf16_dot_linear")}


@pytest.fixture(params=sorted(KERNELS))
def linear(request):
    """One tiled kernel's ``NativeOps`` method, where this build runs it."""
    available, method = KERNELS[request.param]
    if OPS is None or not getattr(OPS, available)():
        pytest.skip(f"this build or CPU has no {request.param} kernel")
    return getattr(OPS, method)


def reference_pack(weight: torch.Tensor, gated_inter: int = 0) -> torch.Tensor:
    """The tile layout written out in torch: [N/16][K/32] tiles of 16 K-pairs x 16 columns x 2, zero-padded; gated,
    the weight's rows in the order gate 0-15, up 0-15, gate 16-31, up 16-31, ..."""
    if gated_inter:
        order = torch.arange(2 * gated_inter).reshape(2, gated_inter // 16, 16).transpose(0, 1).reshape(-1)
        weight = weight[order]
    n, k = weight.shape
    n_pad, k_pad = -(-n // 32) * 32, -(-k // 32) * 32
    padded = torch.zeros(n_pad, k_pad, dtype=weight.dtype)
    padded[:n, :k] = weight
    tiles = padded.reshape(n_pad // 16, 16, k_pad // 32, 16, 2)      # [nt, column, kt, pair, e]
    return tiles.permute(0, 2, 3, 1, 4).reshape(-1)


def assert_rounded_sum(got: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None):
    """``got`` is the float32 sum (+ bias) rounded once to bf16: within one bf16 rounding of torch's float32 product,
    plus what another float32 summation order may change (a few units of 2^-24 of the summed magnitudes)."""
    exact = x.double() @ weight.double().t() + (0 if bias is None else bias.double())
    magnitude = x.double().abs() @ weight.double().abs().t() + (0 if bias is None else bias.double().abs())
    bound = exact.abs() * 2.0 ** -8 + magnitude * x.shape[-1] * 2.0 ** -24
    assert bool(((got.double() - exact).abs() <= bound).all())


@pytest.mark.parametrize("n,k", [(16, 32), (40, 96), (3, 64), (960, 576), (100, 1536)])
def test_packing_is_the_tile_layout(n, k):
    weight = torch.randn(n, k).bfloat16()
    assert torch.equal(OPS.amx_pack(weight), reference_pack(weight))


@pytest.mark.parametrize("n,k,bias", [(16, 32, False), (40, 96, True), (3, 64, False), (960, 576, True),
                                      (100, 1536, False)])
def test_matches_torch_within_a_bf16_step(n, k, bias, linear):
    """Each output is the float32 sum (+ bias) rounded once to bf16."""
    gen = torch.Generator().manual_seed(n * 31 + k)
    weight = torch.randn(n, k, generator=gen).bfloat16()
    b = torch.randn(n, generator=gen) if bias else None
    packed = OPS.amx_pack(weight)
    for rows in (1, 5, 16, 17, 32, 70):
        x = torch.randn(rows, k, generator=gen).bfloat16()
        got = linear(x, packed, n, k, b)
        assert got.dtype == torch.bfloat16 and got.shape == (rows, n)
        assert_rounded_sum(got, x, weight, b)


def test_a_rows_bits_do_not_depend_on_the_row_count_nor_the_threads(linear):
    n, k = 200, 576
    gen = torch.Generator().manual_seed(7)
    weight, b = torch.randn(n, k, generator=gen).bfloat16(), torch.randn(n, generator=gen)
    packed = OPS.amx_pack(weight)
    x = torch.randn(300, k, generator=gen).bfloat16()
    alone = torch.cat([linear(x[i:i + 1], packed, n, k, b) for i in range(x.shape[0])])
    for rows in (2, 15, 16, 17, 31, 32, 33, 64, 129, 300):
        start = 300 - rows
        assert torch.equal(linear(x[start:], packed, n, k, b), alone[start:]), rows
    for threads in (1, 2, 3):
        assert torch.equal(with_threads(threads, lambda: linear(x, packed, n, k, b)), alone), threads


def test_strided_rows_and_leading_dims(linear):
    n, k = 48, 64
    weight = torch.randn(n, k).bfloat16()
    packed = OPS.amx_pack(weight)
    wide = torch.randn(2, 9, 2 * k).bfloat16()
    view = wide[..., :k]                       # rows 2k apart
    got = linear(view, packed, n, k)
    assert got.shape == (2, 9, n)
    assert torch.equal(got, linear(view.contiguous().reshape(-1, k), packed, n, k).reshape(2, 9, n))
    assert linear(torch.empty(0, k, dtype=torch.bfloat16), packed, n, k).shape == (0, n)


def test_a_k_the_kernel_cannot_read_in_place_is_refused(linear):
    weight = torch.randn(8, 40).bfloat16()
    packed = OPS.amx_pack(weight)   # packing pads K; the kernel reads activations in 32-column steps
    with pytest.raises(RuntimeError, match="linear failed"):
        linear(torch.randn(3, 40).bfloat16(), packed, 8, 40)


@pytest.mark.parametrize("inter,k", [(16, 32), (48, 96), (1536, 576)])
def test_a_gated_weight_gives_the_products_bits_and_fuses_the_silu(inter, k, linear):
    """Packed gated, the product comes out in the weight's own column order with the plain packing's bits, and
    ``silu=True`` gives exactly the native silu_mul of that product, at any row count and thread count."""
    gen = torch.Generator().manual_seed(inter + k)
    weight = (torch.randn(2 * inter, k, generator=gen) * 0.2).bfloat16()
    plain, gated = OPS.amx_pack(weight), OPS.amx_pack(weight, inter)
    assert torch.equal(gated, reference_pack(weight, inter))
    x = torch.randn(70, k, generator=gen).bfloat16()
    product = linear(x, plain, 2 * inter, k)
    assert torch.equal(linear(x, gated, 2 * inter, k, gated_inter=inter), product)
    want = OPS.silu_mul(product)
    for rows in (1, 17, 70):
        got = linear(x[:rows], gated, 2 * inter, k, gated_inter=inter, silu=True)
        assert got.shape == (rows, inter) and torch.equal(got, want[:rows]), rows
    for threads in (1, 3):
        assert torch.equal(with_threads(threads, lambda: linear(x, gated, 2 * inter, k, gated_inter=inter,
                                                                        silu=True)), want)


def test_the_fused_silu_keeps_the_ops_bits_at_extremes(linear):
    """Large, tiny and zero pre-activations (the exp clamps, signed zeros) through both paths."""
    inter, k = 16, 32
    weight = torch.zeros(2 * inter, k, dtype=torch.bfloat16)
    weight[:, 0] = torch.tensor([0.0, -0.0, 1e-30, -1e-30, 90.0, -90.0, 200.0, -200.0, 1.0, -1.0, 3e38, -3e38,
                                 0.5, -0.5, 88.5, -87.5] * 2, dtype=torch.bfloat16)
    x = torch.zeros(3, k, dtype=torch.bfloat16)
    x[:, 0] = torch.tensor([1.0, -1.0, 0.0])
    product = linear(x, OPS.amx_pack(weight), 2 * inter, k)
    fused = linear(x, OPS.amx_pack(weight, inter), 2 * inter, k, gated_inter=inter, silu=True)
    assert torch.equal(fused.view(torch.int16), OPS.silu_mul(product).view(torch.int16))


def test_gated_arguments_that_do_not_fit_are_refused(linear):
    weight = torch.randn(40, 32).bfloat16()
    with pytest.raises(ValueError, match="gated"):
        OPS.amx_pack(weight, 20)                  # 20 rows a half: not a multiple of 16
    plain = OPS.amx_pack(torch.randn(32, 32).bfloat16())
    with pytest.raises(RuntimeError, match="silu True"):
        linear(torch.randn(2, 32).bfloat16(), plain, 32, 32, silu=True)   # not packed gated


def test_pack_refuses_other_dtypes():
    with pytest.raises(ValueError, match="bf16"):
        OPS.amx_pack(torch.randn(8, 32))


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="the baseline build is x86-64's")
def test_a_build_without_amx_says_so(tmp_path):
    """The baseline x86-64 build compiles no tile code: AMX and the dot products unavailable, the linears refuse,
    nothing faults."""
    portable = native_ops_for("x86-64", tmp_path)
    assert not portable.amx_available() and not portable.bf16_dot_available()
    weight = torch.randn(16, 32).bfloat16()
    with pytest.raises(RuntimeError, match="AMX unavailable"):
        portable.amx_linear(torch.randn(2, 32).bfloat16(), portable.amx_pack(weight), 16, 32)
    with pytest.raises(RuntimeError, match="AVX-512 BF16 unavailable"):
        portable.bf16_dot_linear(torch.randn(2, 32).bfloat16(), portable.amx_pack(weight), 16, 32)
