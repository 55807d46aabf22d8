"""The native attention kernels give the same bits at every vector width the host runs.

With AVX-512 the kernels score two keys per register and sum 16 dims of V per register; each lane does what the
8-lane AVX2 code does. So on a host with AVX-512 the library is built a second time for x86-64-v3 (AVX2, FMA,
no AVX-512) and every output must equal the native build's to the bit: a query's attention does not depend on
which x86 machine of a fleet served it, and the prefix cache's invariance (decode = multi-token) holds on both."""
from __future__ import annotations

import platform

import pytest
import torch

from gh200rt.backends.cpu.native import load_native_ops, native_ops_error
from gh200rt.platform.cpu_features import cpu_flags
from tests.kernels.native_builds import native_ops_for
from tests.kernels.paged_cases import scattered_case
from tests.kernels.test_cpu_native import _query_starts, fp8_case

NATIVE = load_native_ops()
pytestmark = [
    pytest.mark.skipif(NATIVE is None, reason=f"native CPU ops unavailable: {native_ops_error()}"),
    pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="the x86-64-v3 build is x86's"),
    pytest.mark.skipif(not {"avx512f", "avx2", "fma"} <= cpu_flags(),
                       reason="no AVX-512 here: the native build is the only vector width"),
]
DTYPES = [torch.float32, torch.bfloat16]


@pytest.fixture(scope="module")
def avx2(tmp_path_factory):
    return native_ops_for("x86-64-v3", tmp_path_factory.mktemp("avx2"))


def test_the_build_is_another_library(avx2):
    assert avx2._lib._name != NATIVE._lib._name


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads,kv_heads,d", [(9, 3, 64), (4, 4, 128), (16, 2, 80)])
@pytest.mark.parametrize("query_lens,seq_lens", [([1, 1, 1], [1, 130, 77]), ([1], [1100]),
                                                 ([1] * 9, [200, 1, 8, 71, 129, 5, 64, 33, 16]),
                                                 ([40, 3, 150, 1], [40, 3, 200, 9]),
                                                 ([7, 64], [71, 300])])
def test_attention_bits_do_not_depend_on_the_vector_width(avx2, dtype, heads, kv_heads, d, query_lens, seq_lens):
    q, pool, meta, _ = scattered_case(query_lens, seq_lens, heads, kv_heads, d, 16, dtype, seed=len(seq_lens) + d)
    starts = _query_starts(query_lens)

    def outputs(ops):
        got = [ops.extend_attention(q, pool, meta.block_tables, meta.seq_lens, starts, d ** -0.5)]
        if all(n == 1 for n in query_lens):
            got.append(ops.decode_attention(q, pool, meta.block_tables, meta.seq_lens, d ** -0.5))
        return got
    for wide, narrow in zip(outputs(NATIVE), outputs(avx2)):
        assert torch.equal(wide, narrow), f"differ by up to {(wide.float() - narrow.float()).abs().max().item():.3g}"


@pytest.mark.parametrize("fp8_dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_fp8_pools_too(avx2, fp8_dtype):
    query_lens, seq_lens = [5, 8, 70], [21, 8, 133]
    q, stored, _, kv_scale, meta = fp8_case(query_lens, seq_lens, torch.bfloat16, fp8_dtype, seed=32)
    starts = _query_starts(query_lens)
    want = avx2.extend_attention(q, stored, meta.block_tables, meta.seq_lens, starts, 0.125, kv_scale)
    assert torch.equal(NATIVE.extend_attention(q, stored, meta.block_tables, meta.seq_lens, starts, 0.125, kv_scale),
                       want)
    q, stored, widened, kv_scale, meta = fp8_case([1], [1100], torch.bfloat16, fp8_dtype, seed=33)
    got = NATIVE.decode_attention(q, stored, meta.block_tables, meta.seq_lens, 0.125, kv_scale)
    assert torch.equal(got, avx2.decode_attention(q, stored, meta.block_tables, meta.seq_lens, 0.125, kv_scale))
    assert torch.equal(got, NATIVE.decode_attention(q, widened, meta.block_tables, meta.seq_lens, 0.125))
