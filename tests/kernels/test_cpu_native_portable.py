"""The native CPU ops' portable C paths: what a host without AVX2 / FMA / F16C or NEON runs (Grace's NEON build and
the portable aarch64 build are checked under emulation by test_cpu_native_aarch64.py).

On an x86-64 host the library is built a second time for the baseline x86-64 ISA (no AVX), which compiles every
``#else`` branch, and each op is checked against the vector build (itself checked against torch in
test_cpu_native.py) on the same inputs: the same results within float32 rounding, and the same contracts where
the portable paths promise them (the fp16 and fp8 linears have the float32 linear's bits over the widened weight;
a row's bits do not depend on the thread count)."""
from __future__ import annotations

import platform

import pytest
import torch

from gh200rt.backends.cpu.native import load_native_ops, native_ops_error
from gh200rt.formats.pack import quantize_int4, quantize_int8
from gh200rt.kv import fp8
from tests.kernels.fp8_weights import fp8_weight
from tests.kernels.native_builds import native_ops_for
from tests.kernels.paged_cases import scattered_case
from tests.kernels.threads import with_threads

VECTOR = load_native_ops()
pytestmark = [
    pytest.mark.skipif(VECTOR is None, reason=f"native CPU ops unavailable: {native_ops_error()}"),
    pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="the baseline build is x86-64's"),
]


@pytest.fixture(scope="module")
def portable(tmp_path_factory):
    return native_ops_for("x86-64", tmp_path_factory.mktemp("portable"))


def close(got: torch.Tensor, want: torch.Tensor, tol: float = 1e-5):
    torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol)


def test_the_build_is_another_library(portable):
    assert portable._lib._name != VECTOR._lib._name


@pytest.mark.parametrize("n,k", [(203, 580), (7, 13), (1000, 576)])
def test_linears(portable, n, k):
    gen = torch.Generator().manual_seed(n + k)
    weight, bias = torch.randn(n, k, generator=gen), torch.randn(n, generator=gen)
    half = weight.half()
    fp8 = fp8_weight(n, k, 16, n)
    for rows in (1, 3, 8):
        x = torch.randn(rows, k, generator=gen)
        close(portable.f32_linear(x, weight, bias), VECTOR.f32_linear(x, weight, bias), 1e-4)
        got = portable.f16_linear(x, half, bias)
        assert torch.equal(got, portable.f32_linear(x, half.float(), bias))
        close(got, VECTOR.f16_linear(x, half, bias), 1e-4)
        assert torch.equal(got, with_threads(1, lambda: portable.f16_linear(x, half, bias)))
        got = portable.fp8_linear(x, fp8.qweight, fp8.scale, fp8.group_size, bias)
        assert torch.equal(got, portable.f32_linear(x, fp8.dequantize(), bias))
        close(got, VECTOR.fp8_linear(x, fp8.qweight, fp8.scale, fp8.group_size, bias), 1e-4)
        if k % 32 == 0:
            for packed in (quantize_int8(weight, 32), quantize_int4(weight, 32)):
                close(portable.quant_linear(x, packed), VECTOR.quant_linear(x, packed), 1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_elementwise_ops(portable, dtype):
    gen = torch.Generator().manual_seed(5)
    x, w = torch.randn(6, 96, generator=gen).to(dtype), torch.randn(96, generator=gen).to(dtype)
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    close(portable.rms_norm(x, w, 1e-6), VECTOR.rms_norm(x, w, 1e-6), tol)
    close(portable.silu_mul(x), VECTOR.silu_mul(x), tol)
    heads = x.view(6, 3, 32)
    cos, sin = torch.randn(6, 1, 16, generator=gen).to(dtype), torch.randn(6, 1, 16, generator=gen).to(dtype)
    close(portable.rotary(heads, cos, sin), VECTOR.rotary(heads, cos, sin), tol)


@pytest.mark.parametrize("d", [64, 24])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_paged_attention(portable, d, dtype):
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    query_lens, seq_lens = [1, 1, 1], [5, 40, 130]
    q, pool, meta, _ = scattered_case(query_lens, seq_lens, 6, 2, d, 16, dtype, seed=d)
    close(portable.decode_attention(q, pool, meta.block_tables, meta.seq_lens, d ** -0.5),
          VECTOR.decode_attention(q, pool, meta.block_tables, meta.seq_lens, d ** -0.5), tol)
    query_lens, seq_lens = [9, 130, 4], [9, 130, 40]
    q, pool, meta, _ = scattered_case(query_lens, seq_lens, 6, 2, d, 16, dtype, seed=d + 1)
    starts = torch.tensor([0, 9, 139, 143])
    got = portable.extend_attention(q, pool, meta.block_tables, meta.seq_lens, starts, d ** -0.5)
    close(got, VECTOR.extend_attention(q, pool, meta.block_tables, meta.seq_lens, starts, d ** -0.5), tol)
    assert torch.equal(got, with_threads(1, lambda: portable.extend_attention(q, pool, meta.block_tables,
                                                                              meta.seq_lens, starts, d ** -0.5)))
    kv_scale = torch.tensor([0.02, 0.03])
    stored = torch.stack([fp8.quantize(pool[0], kv_scale[0], torch.float8_e4m3fn),
                          fp8.quantize(pool[1], kv_scale[1], torch.float8_e4m3fn)])
    close(portable.extend_attention(q, stored, meta.block_tables, meta.seq_lens, starts, d ** -0.5, kv_scale),
          VECTOR.extend_attention(q, stored, meta.block_tables, meta.seq_lens, starts, d ** -0.5, kv_scale), tol)
    rows, slots = q[:, :2], torch.arange(q.shape[0]) + 3
    written = [stored.clone(), stored.clone()]
    for ops, pool_copy in zip((portable, VECTOR), written):
        ops.write_kv(pool_copy.view(2, -1, 1, 2, d), rows, rows * 0.5, slots, kv_scale)
    assert torch.equal(written[0].view(torch.uint8), written[1].view(torch.uint8))
