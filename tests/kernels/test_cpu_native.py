"""The native CPU ops (kernels/cpu/layer_ops.c, kv_store.c, extend_attention.c, decode_attention.c) against the
torch ops they replace, and their build.

Rotary and the KV store must give the torch ops' bits; RMSNorm, SiLU-and-mul and decode attention
agree to float32 rounding (their sums and exp are evaluated in another order), in bf16 to one bf16
step. The engine-level checks (every placement bit-identical with the native ops on, the native and
torch ops giving the same greedy tokens) are at the end."""
import pytest
import torch

from gh200rt.backends.cpu import half_linear, native
from gh200rt.backends.cpu.half_linear import NATIVE_F16_MAX_ROWS, fbgemm_form, fbgemm_fp16_available
from gh200rt.backends.cpu.native import NativeOpsError, load_native_ops
from gh200rt.formats.pack import HalfWeight
from gh200rt.kv import fp8
from gh200rt.kv.arena import DeviceArena
from gh200rt.kv.attention import paged_attention, write_kv
from gh200rt.models.layers.activation import silu_and_mul
from gh200rt.models.layers.rmsnorm import rms_norm
from gh200rt.models.layers.rotary import apply_rotary
from tests.kernels.fp8_weights import fp8_weight
from tests.kernels.paged_cases import scattered_case
from tests.kernels.threads import with_threads

OPS = load_native_ops()
pytestmark = pytest.mark.skipif(OPS is None, reason=f"native CPU ops unavailable: {native.native_ops_error()}")
DTYPES = [torch.float32, torch.bfloat16]


def assert_close(got, want, dtype, bf16_atol=1e-5):
    assert got.dtype == want.dtype and got.shape == want.shape
    if dtype == torch.float32:
        torch.testing.assert_close(got, want, rtol=2e-6, atol=2e-6)
    else:  # one bf16 step where an fp32 sum or exp lands on the other side of a rounding boundary
        torch.testing.assert_close(got.float(), want.float(), rtol=8e-3, atol=bf16_atol)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 576), (7, 96), (3, 4, 64), (2, 37)])
def test_rms_norm_matches_torch(dtype, shape):
    gen = torch.Generator().manual_seed(1)
    x = (torch.randn(shape, generator=gen) * 3).to(dtype)
    weight = torch.randn(shape[-1], generator=gen).to(dtype)
    assert_close(OPS.rms_norm(x, weight, 1e-6), rms_norm(x, weight, 1e-6), dtype)
    strided = torch.randn(shape[0], 2 * shape[-1], generator=gen).to(dtype)[:, ::2]  # rows with a gap
    assert_close(OPS.rms_norm(strided, weight, 1e-5), rms_norm(strided, weight, 1e-5), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,inter", [(1, 1536), (5, 40), (3, 7)])
def test_silu_mul_matches_torch(dtype, rows, inter):
    gate_up = (torch.randn(rows, 2 * inter, generator=torch.Generator().manual_seed(2)) * 4).to(dtype)
    gate_up[0, :4] = torch.tensor([-100.0, 100.0, 0.0, -0.0])  # exp's clamped ends and zero
    assert_close(OPS.silu_mul(gate_up), silu_and_mul(gate_up), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rotary_is_bit_identical_to_torch(dtype):
    gen = torch.Generator().manual_seed(3)
    qkv = torch.randn(6, (9 + 2 * 3) * 64, generator=gen).to(dtype)
    x = qkv[:, :12 * 64].view(6, 12, 64)  # q and k heads of a fused projection: a strided view
    cos, sin = torch.randn(6, 1, 32, generator=gen).to(dtype), torch.randn(6, 1, 32, generator=gen).to(dtype)
    assert torch.equal(OPS.rotary(x, cos, sin), apply_rotary(x, cos, sin))


def _arena_pool(dtype, blocks=12, block_size=4, kv_heads=3, head_dim=16, layer=1):
    arena = DeviceArena(blocks, 3, block_size, kv_heads, head_dim, dtype, "cpu")
    return arena.kv_caches()[layer]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["contiguous", "arena (strided)"])
def test_write_kv_is_bit_identical_to_torch_and_skips_padding(dtype, layout):
    gen = torch.Generator().manual_seed(4)
    if layout == "contiguous":
        pool = torch.zeros(2, 12, 4, 3, 16, dtype=dtype)
    else:
        pool = _arena_pool(dtype)
        pool.zero_()
    kv = torch.randn(5, 6, 16, generator=gen).to(dtype)
    k, v = kv[:, :3], kv[:, 3:]  # strided views of one projection, as the layer passes them
    slots = torch.tensor([5, -1, 40, 0, 17])
    expected = pool.clone()
    write_kv(expected, k, v, slots)
    OPS.write_kv(pool, k, v, slots)
    assert torch.equal(pool, expected)
    assert pool.abs().sum() > 0


def test_write_kv_rejects_a_mismatched_pool():
    with pytest.raises(ValueError, match="KV pool"):
        OPS.write_kv(torch.zeros(2, 4, 4, 3, 8), torch.zeros(1, 3, 16), torch.zeros(1, 3, 16), torch.tensor([0]))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads,kv_heads,d", [(9, 3, 64), (4, 4, 128), (8, 2, 24)])
@pytest.mark.parametrize("seq_lens", [[1], [17, 3, 40, 16], [64, 9]])
def test_decode_attention_matches_torch(dtype, heads, kv_heads, d, seq_lens):
    q, pool, meta, _ = scattered_case([1] * len(seq_lens), seq_lens, heads, kv_heads, d, 8, dtype, seed=5)
    want = paged_attention(q, pool, meta, d ** -0.5, kv_heads)
    got = OPS.decode_attention(q, pool, meta.block_tables, meta.seq_lens, d ** -0.5)
    # bf16: SDPA rounds the probabilities to bf16 before multiplying V, the kernel keeps them in float32,
    # so outputs near zero differ by a bf16 step of the larger terms (the kernel is the closer to float32)
    assert_close(got, want, dtype, bf16_atol=4e-3)
    exact = paged_attention(q.float(), pool.float(), meta, d ** -0.5, kv_heads)
    assert (got.float() - exact).abs().max() <= (want.float() - exact).abs().max() + 1e-6
    # through the torch attention's decode hook, on a strided query view
    wide = torch.cat([q, q], dim=1)[:, :heads]
    hooked = paged_attention(wide, pool, meta, d ** -0.5, kv_heads, decode_kernel=OPS.decode_attention)
    assert torch.equal(hooked, got)


def test_decode_hook_leaves_multi_token_groups_to_sdpa():
    """A mixed step: the decode rows go to the kernel, the prompt and chunk rows keep the torch path."""
    q, pool, meta, _ = scattered_case([1, 12, 1, 4], [30, 12, 9, 17], 9, 3, 64, 8, torch.float32, seed=6)
    want = paged_attention(q, pool, meta, 0.125, 3)
    got = paged_attention(q, pool, meta, 0.125, 3, decode_kernel=OPS.decode_attention)
    decode_rows = [0, 13]  # sequences 0 and 2 in the flat step (rows 1-12: the prompt, 14-17: the chunk)
    multi_rows = [r for r in range(q.shape[0]) if r not in decode_rows]
    assert torch.equal(got[multi_rows], want[multi_rows])
    assert_close(got[decode_rows], want[decode_rows], torch.float32)


# (query_lens, seq_lens): prompts (one length, mixed, one longer than the kernel's 64-key V chunk), chunks after
# a cached prefix, a single new token; block size 8, so lengths sit on and off block edges
EXTEND_FORMS = {
    "prompts, one length": ([9, 9], [9, 9]),
    "prompts, mixed lengths": ([3, 16, 17, 2], [3, 16, 17, 2]),
    "a long prompt": ([150], [150]),
    "chunks after a cached prefix": ([5, 8, 70], [21, 8, 133]),
    "one new token after a prefix": ([1, 4], [30, 4]),
}


def _query_starts(query_lens):
    return torch.tensor([0, *torch.tensor(query_lens).cumsum(0).tolist()])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads,kv_heads,d", [(9, 3, 64), (4, 4, 128), (8, 2, 24), (6, 3, 20)])
@pytest.mark.parametrize("form", EXTEND_FORMS)
def test_extend_attention_matches_torch(dtype, heads, kv_heads, d, form):
    """Head sizes a multiple of 16 take the vector path on AVX2 hosts, 24 and 20 the portable one."""
    query_lens, seq_lens = EXTEND_FORMS[form]
    q, pool, meta, _ = scattered_case(query_lens, seq_lens, heads, kv_heads, d, 8, dtype, seed=13)
    want = paged_attention(q, pool, meta, d ** -0.5, kv_heads)
    got = OPS.extend_attention(q, pool, meta.block_tables, meta.seq_lens, _query_starts(query_lens), d ** -0.5)
    assert_close(got, want, dtype, bf16_atol=4e-3)
    exact = paged_attention(q.float(), pool.float(), meta, d ** -0.5, kv_heads)
    assert (got.float() - exact).abs().max() <= (want.float() - exact).abs().max() + 1e-6


def test_extend_attention_of_a_query_does_not_depend_on_its_tile():
    """The last rows of a 20-token prompt, attended in the whole prompt's call and as a 4-token chunk after a
    16-token prefix (other tile mates, other key counts per tile): the same bits."""
    whole_q, pool, meta, _ = scattered_case([20], [20], 9, 3, 64, 8, torch.float32, seed=14)
    whole = OPS.extend_attention(whole_q, pool, meta.block_tables, meta.seq_lens, _query_starts([20]), 0.125)
    chunk = OPS.extend_attention(whole_q[16:], pool, meta.block_tables, meta.seq_lens, _query_starts([4]), 0.125)
    assert torch.equal(chunk, whole[16:])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads,kv_heads,d", [(9, 3, 64), (4, 4, 128), (16, 2, 64), (10, 2, 128), (8, 2, 24),
                                              (6, 3, 20)])
@pytest.mark.parametrize("seq_lens", [[1], [17, 3, 40, 16], [64, 9, 130], [200, 1, 8, 71, 129, 5, 64, 33, 16], [300],
                                      [1100]])
def test_decode_attention_gives_the_extend_kernels_bits(dtype, heads, kv_heads, d, seq_lens):
    """A position's attention is the same arithmetic whether it is a sequence's one new token (decode kernel) or
    the last row of a prompt chunk (multi-token kernel): a prompt whose tail is one token after a cached prefix,
    or a decoded token whose block a later prompt reuses, gets a full prefill's bits (prefix-cache invariance).
    The cases cover the decode kernel's tiles of 8 keys and chunks of 64 with their tails, groups of 1, 3, 5 and 8
    heads (its 4-head V tiles), and both work splits: whole sequences (nine sequences on two threads) and
    (sequence, KV head) pairs (fewer, long ones among them)."""
    q, pool, meta, _ = scattered_case([1] * len(seq_lens), seq_lens, heads, kv_heads, d, 8, dtype, seed=17)
    decode = OPS.decode_attention(q, pool, meta.block_tables, meta.seq_lens, d ** -0.5)
    extend = OPS.extend_attention(q, pool, meta.block_tables, meta.seq_lens, _query_starts([1] * len(seq_lens)),
                                  d ** -0.5)
    worst = (decode.float() - extend.float()).abs().max().item()
    assert torch.equal(decode, extend), f"decode and multi-token attention differ by up to {worst:.3g}"


def test_extend_hook_takes_the_multi_token_rows():
    """A mixed step: the prompt and chunk rows go to the extend kernel, the decode rows to the decode kernel."""
    query_lens, seq_lens = [1, 12, 1, 4], [30, 12, 9, 17]
    q, pool, meta, _ = scattered_case(query_lens, seq_lens, 9, 3, 64, 8, torch.float32, seed=15)
    got = paged_attention(q, pool, meta, 0.125, 3, decode_kernel=OPS.decode_attention,
                          extend_kernel=OPS.extend_attention)
    multi_rows = [r for r in range(q.shape[0]) if r not in (0, 13)]
    want = OPS.extend_attention(q[multi_rows], pool, meta.block_tables[[1, 3]], meta.seq_lens[[1, 3]],
                                _query_starts([12, 4]), 0.125)
    assert torch.equal(got[multi_rows], want)
    assert torch.equal(got[[0, 13]], OPS.decode_attention(q[[0, 13]], pool, meta.block_tables[[0, 2]],
                                                          meta.seq_lens[[0, 2]], 0.125))


def test_long_contexts_stay_with_sdpa(monkeypatch):
    """The attention adapter sends a multi-token group past ``EXTEND_MAX_KEYS`` to SDPA, shorter ones to the kernel."""
    from gh200rt.backends.cpu import ops
    attention = ops.native_cpu_ops(OPS)["attention"]
    q, pool, meta, _ = scattered_case([6, 9], [40, 9], 9, 3, 64, 8, torch.float32, seed=16)
    sdpa = paged_attention(q, pool, meta, 0.125, 3)
    kernel = OPS.extend_attention(q, pool, meta.block_tables, meta.seq_lens, _query_starts([6, 9]), 0.125)
    assert not torch.equal(sdpa, kernel)   # the two differ in the last bits, so the route shows
    monkeypatch.setattr(ops, "EXTEND_MAX_KEYS", 40)
    assert torch.equal(attention(q, pool, meta, 0.125, 3), kernel)
    monkeypatch.setattr(ops, "EXTEND_MAX_KEYS", 39)
    assert torch.equal(attention(q, pool, meta, 0.125, 3), sdpa)


FP8 = [torch.float8_e4m3fn, torch.float8_e5m2]


@pytest.mark.parametrize("fp8_dtype", FP8)
def test_fp8_values_are_torchs(fp8_dtype):
    want = torch.arange(256, dtype=torch.uint8).view(fp8_dtype).float()
    torch.testing.assert_close(OPS.fp8_values(fp8_dtype), want, rtol=0, atol=0, equal_nan=True)


def fp8_case(query_lens, seq_lens, dtype, fp8_dtype, seed):
    """A scattered case whose pool is quantized to ``fp8_dtype`` with made-up K and V scales, and the pool
    kv/fp8.py's dequantize gives back (what the torch path attends over)."""
    q, pool, meta, _ = scattered_case(query_lens, seq_lens, 9, 3, 64, 8, torch.float32, seed=seed)
    kv_scale = torch.tensor([0.013, 0.021])
    stored = torch.stack([fp8.quantize(pool[i], kv_scale[i], fp8_dtype) for i in (0, 1)])
    widened = torch.stack([fp8.dequantize(stored[i], kv_scale[i], dtype) for i in (0, 1)])
    return q.to(dtype), stored, widened, kv_scale, meta


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fp8_dtype", FP8)
def test_attention_reads_an_fp8_pool_as_its_dequantized_copy(dtype, fp8_dtype):
    """Each K / V element read is kv/fp8.py's dequantize of the stored byte, so the kernels give the bits they give
    over the dequantized pool; against the torch path (gather, dequantize, SDPA) the usual rounding."""
    q, stored, widened, kv_scale, meta = fp8_case([1, 1, 1], [30, 7, 64], dtype, fp8_dtype, seed=31)
    got = OPS.decode_attention(q, stored, meta.block_tables, meta.seq_lens, 0.125, kv_scale)
    assert torch.equal(got, OPS.decode_attention(q, widened, meta.block_tables, meta.seq_lens, 0.125))
    assert_close(got, paged_attention(q, stored, meta, 0.125, 3, kv_scale), dtype, bf16_atol=4e-3)
    query_lens, seq_lens = [5, 8, 70], [21, 8, 133]
    q, stored, widened, kv_scale, meta = fp8_case(query_lens, seq_lens, dtype, fp8_dtype, seed=32)
    starts = _query_starts(query_lens)
    got = OPS.extend_attention(q, stored, meta.block_tables, meta.seq_lens, starts, 0.125, kv_scale)
    assert torch.equal(got, OPS.extend_attention(q, widened, meta.block_tables, meta.seq_lens, starts, 0.125))
    assert_close(got, paged_attention(q, stored, meta, 0.125, 3, kv_scale), dtype, bf16_atol=4e-3)
    # the scales are read at call time: a calibration that rescales in place is seen by the next call
    kv_scale.mul_(2)
    again = OPS.extend_attention(q, stored, meta.block_tables, meta.seq_lens, starts, 0.125, kv_scale)
    assert not torch.equal(again, got)


def test_the_attention_adapter_takes_fp8_pools_to_the_kernels():
    from gh200rt.backends.cpu import ops
    attention = ops.native_cpu_ops(OPS)["attention"]
    query_lens, seq_lens = [1, 12, 1, 4], [30, 12, 9, 17]
    q, stored, widened, kv_scale, meta = fp8_case(query_lens, seq_lens, torch.float32, torch.float8_e4m3fn, seed=33)
    assert torch.equal(attention(q, stored, meta, 0.125, 3, kv_scale), attention(q, widened, meta, 0.125, 3))


def test_an_fp8_pool_needs_its_scales():
    q, stored, _, kv_scale, meta = fp8_case([1], [9], torch.float32, torch.float8_e4m3fn, seed=34)
    for bad in (None, kv_scale.double(), kv_scale[:1]):
        with pytest.raises(TypeError, match="fp8 pool"):
            OPS.decode_attention(q, stored, meta.block_tables, meta.seq_lens, 0.125, bad)
    with pytest.raises(TypeError, match="fp8 pool"):   # a pool of another dtype is no fp8 pool either
        OPS.decode_attention(q, stored.to(torch.bfloat16), meta.block_tables, meta.seq_lens, 0.125, kv_scale)


def test_extend_attention_rejects_mismatched_starts():
    q, pool, meta, _ = scattered_case([3, 4], [3, 4], 9, 3, 64, 8, torch.float32, seed=17)
    with pytest.raises(ValueError, match="extend_attention"):
        OPS.extend_attention(q, pool, meta.block_tables, meta.seq_lens, torch.tensor([0, 7]), 0.125)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads,kv_heads,d", [(9, 3, 64), (4, 4, 32)])
def test_decode_attention_block_gives_the_three_ops_bits(dtype, heads, kv_heads, d):
    """RoPE + KV store + decode attention from a fused qkv row, in one call: the same bits as the three ops,
    the same pool afterwards; a padding row (slot -1) writes nothing."""
    seq_lens = [5, 17, 9]
    _, pool, meta, gen = scattered_case([1, 1, 1], seq_lens, heads, kv_heads, d, 8, dtype, seed=9)
    slots = meta.slot_mapping.clone()
    slots[2] = -1
    meta.slot_mapping = slots
    qkv = torch.randn(3, (heads + 2 * kv_heads) * d, generator=gen).to(dtype)
    angles = torch.rand(3, 1, d // 2, generator=gen) * 6
    cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)
    separate, fused = pool.clone(), pool.clone()
    qk = OPS.rotary(qkv[:, :(heads + kv_heads) * d].view(3, heads + kv_heads, d), cos, sin)
    OPS.write_kv(separate, qk[:, heads:], qkv[:, (heads + kv_heads) * d:].view(3, kv_heads, d), slots)
    want = OPS.decode_attention(qk[:, :heads], separate, meta.block_tables, meta.seq_lens, d ** -0.5)
    got = OPS.decode_attention_block(qkv, cos, sin, fused, slots, meta.block_tables, meta.seq_lens, d ** -0.5,
                                     heads, kv_heads)
    assert torch.equal(got, want) and torch.equal(fused, separate)
    with pytest.raises(ValueError, match="decode_attention_block"):
        OPS.decode_attention_block(qkv[:, :-d], cos, sin, fused, slots, meta.block_tables, meta.seq_lens, 0.1,
                                   heads, kv_heads)


def fp8_probe_values(fp8_dtype, scale: float) -> torch.Tensor:
    """What a quantized write meets: every fp8 value, the midpoints between neighbours and the floats either side
    of them (round-to-even ties), values spread over 40 binades, zeros, infinities, NaN and overflow; times
    ``scale`` (the write divides by it)."""
    grid = torch.arange(256, dtype=torch.uint8).view(fp8_dtype).float()
    grid = grid[grid.isfinite()].unique()
    mids = (grid[1:] + grid[:-1]) / 2
    spread = torch.logspace(-30, 10, 997, base=2.0) * torch.tensor([1.0, -1.0]).repeat(499)[:997]
    special = torch.tensor([0.0, -0.0, float("inf"), float("-inf"), float("nan"), 1e30, -1e30])
    values = torch.cat([grid, mids, mids.nextafter(torch.tensor(float("inf"))),
                        mids.nextafter(torch.tensor(float("-inf"))), spread, special])
    return values * scale


@pytest.mark.parametrize("fp8_dtype", FP8)
@pytest.mark.parametrize("dtype", DTYPES)
def test_write_kv_into_an_fp8_pool_has_torchs_bytes(fp8_dtype, dtype):
    kv_scale = torch.tensor([0.75, 3.0])
    k, v = fp8_probe_values(fp8_dtype, 0.75), fp8_probe_values(fp8_dtype, 3.0)
    tokens = -(-k.numel() // 64)
    k = torch.cat([k, k.new_zeros(tokens * 64 - k.numel())]).view(tokens, 1, 64).to(dtype)
    v = torch.cat([v, v.new_zeros(tokens * 64 - v.numel())]).flip(0).view(tokens, 1, 64).to(dtype)
    slots = torch.randperm(tokens + 5, generator=torch.Generator().manual_seed(35))[:tokens]
    slots[3] = -1   # a padding row writes nothing
    native = torch.zeros(2, tokens + 5, 1, 1, 64, dtype=fp8_dtype)
    want = native.clone()
    OPS.write_kv(native, k, v, slots, kv_scale)
    write_kv(want, k, v, slots, kv_scale)
    assert torch.equal(native.view(torch.uint8), want.view(torch.uint8))


@pytest.mark.parametrize("fp8_dtype", FP8)
def test_decode_attention_block_with_an_fp8_pool(fp8_dtype):
    heads, kv_heads, d = 9, 3, 64
    q, stored, _, kv_scale, meta = fp8_case([1, 1, 1], [5, 17, 9], torch.float32, fp8_dtype, seed=36)
    gen = torch.Generator().manual_seed(37)
    qkv = torch.randn(3, (heads + 2 * kv_heads) * d, generator=gen)
    angles = torch.rand(3, 1, d // 2, generator=gen) * 6
    cos, sin = angles.cos(), angles.sin()
    separate, fused = stored.clone(), stored.clone()
    qk = OPS.rotary(qkv[:, :(heads + kv_heads) * d].view(3, heads + kv_heads, d), cos, sin)
    write_kv(separate, qk[:, heads:], qkv[:, (heads + kv_heads) * d:].view(3, kv_heads, d), meta.slot_mapping,
                   kv_scale)
    want = OPS.decode_attention(qk[:, :heads], separate, meta.block_tables, meta.seq_lens, 0.125, kv_scale)
    got = OPS.decode_attention_block(qkv, cos, sin, fused, meta.slot_mapping, meta.block_tables, meta.seq_lens,
                                     0.125, heads, kv_heads, kv_scale)
    assert torch.equal(got, want) and torch.equal(fused.view(torch.uint8), separate.view(torch.uint8))


@pytest.mark.parametrize("dtype", DTYPES)
def test_ops_give_the_same_bits_on_any_thread_count(dtype):
    """Sizes above the C code's sharing threshold (a prefill chunk, a batch of long decodes), so rows and
    (sequence, KV head) pairs are split over 3 threads: each row's bits are the one-thread bits."""
    gen = torch.Generator().manual_seed(11)
    x = (torch.randn(301, 576, generator=gen) * 3).to(dtype)
    weight = torch.randn(576, generator=gen).to(dtype)
    gate_up = (torch.randn(97, 2 * 1536, generator=gen) * 4).to(dtype)
    qk = torch.randn(211, 12, 64, generator=gen).to(dtype)
    cos, sin = torch.randn(211, 1, 32, generator=gen).to(dtype), torch.randn(211, 1, 32, generator=gen).to(dtype)
    q, pool, meta, _ = scattered_case([1] * 7, [300, 5, 129, 64, 1, 77, 250], 9, 3, 64, 16, dtype, seed=12)

    prompts, prompt_pool, prompt_meta, _ = scattered_case([40, 3, 150, 1], [40, 3, 200, 9], 9, 3, 64, 16, dtype,
                                                          seed=13)
    # one long sequence: its 3 KV heads as work items spread over 3 threads, against one thread
    alone, alone_pool, alone_meta, _ = scattered_case([1], [1100], 9, 3, 64, 16, dtype, seed=14)

    def run():
        return (OPS.rms_norm(x, weight, 1e-5), OPS.silu_mul(gate_up), OPS.rotary(qk, cos, sin),
                OPS.decode_attention(q, pool, meta.block_tables, meta.seq_lens, 0.125),
                OPS.extend_attention(prompts, prompt_pool, prompt_meta.block_tables, prompt_meta.seq_lens,
                                     _query_starts([40, 3, 150, 1]), 0.125),
                OPS.decode_attention(alone, alone_pool, alone_meta.block_tables, alone_meta.seq_lens, 0.125))

    one, three = with_threads(1, run), with_threads(3, run)
    for a, b in zip(one, three):
        assert torch.equal(a, b)
    assert_close(three[0], rms_norm(x, weight, 1e-5), dtype)
    assert_close(three[3], paged_attention(q, pool, meta, 0.125, 3), dtype, bf16_atol=4e-3)


def test_decode_attention_on_the_arena_pool():
    pool = _arena_pool(torch.float32, blocks=12, block_size=4, kv_heads=3, head_dim=16, layer=2)
    pool.copy_(torch.randn(pool.shape, generator=torch.Generator().manual_seed(7)))
    from gh200rt.models.base import AttentionMetadata
    meta = AttentionMetadata.build([1, 1], [7, 10], [[3, 9], [11, 2, 5]], 4)
    q = torch.randn(2, 6, 16, generator=torch.Generator().manual_seed(8))
    assert_close(OPS.decode_attention(q, pool, meta.block_tables, meta.seq_lens, 0.25),
                 paged_attention(q, pool, meta, 0.25, 3), torch.float32)


def test_build_without_a_compiler_says_why(monkeypatch):
    monkeypatch.setattr(native, "_compiler", lambda: None)
    with pytest.raises(NativeOpsError, match="no C compiler"):
        native._load()


def test_build_is_cached_per_source_and_machine(tmp_path, monkeypatch):
    monkeypatch.setenv("GH200RT_CACHE_DIR", str(tmp_path))
    # one source is a library of its own (undefined symbols wait for the loader): the cache is what is tested
    cc, sources = native._compiler(), (native.SOURCES[:1], native.HEADERS)
    first = native._build(cc, *sources)
    assert first.parent == tmp_path / "native" and first.exists()
    stamp = first.stat().st_mtime_ns
    assert native._build(cc, *sources) == first and first.stat().st_mtime_ns == stamp  # loaded, not rebuilt
    monkeypatch.setattr(native, "_cpu_identity", lambda: "another machine")
    assert native._build(cc, *sources) != first


def test_a_broken_source_reports_the_compiler_error(tmp_path, monkeypatch):
    broken = tmp_path / "layer_ops.c"
    broken.write_text("void gh_rms_norm( {\n")
    monkeypatch.setenv("GH200RT_CACHE_DIR", str(tmp_path / "cache"))
    with pytest.raises(NativeOpsError, match="failed to build layer_ops.c"):
        native.build_library((broken,), native.HEADERS)


# ---- the native quantized linear (kernels/cpu/quant_linear.c) --------------------------------------------

def _packed(fmt, n, k, group, seed=0):
    from gh200rt.formats.pack import quantize_int4, quantize_int8
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(seed))
    return quantize_int4(w, group) if fmt == "int4" else quantize_int8(w, group)


@pytest.mark.parametrize("fmt", ["int4", "int8"])
@pytest.mark.parametrize("n,k,group", [(1000, 576, 32), (7, 96, 32), (4, 1536, 1536), (13, 256, 64)])
def test_quant_linear_matches_the_dequantized_weight(fmt, n, k, group):
    weight = _packed(fmt, n, k, group)
    dense = weight.dequantize().double()
    for rows in (1, 2, 3, 5, 8, 33):
        x = torch.randn(rows, k, generator=torch.Generator().manual_seed(rows))
        got = OPS.quant_linear(x, weight)
        want = (x.double() @ dense.T)
        # x rounded to int16 per 32 columns (each element within 1/65534 of its block's largest |x|), exact
        # integer products, float32 sums: a few 1e-5 of the output's scale
        assert (got.double() - want).abs().max().item() <= 1e-4 * want.abs().max().item()


@pytest.mark.parametrize("fmt", ["int4", "int8"])
def test_quant_linear_rows_and_threads_do_not_change_a_rows_bits(fmt):
    weight = _packed(fmt, 203, 576, 32, seed=3)   # 203: a last block of 3 channels
    x = torch.randn(11, 576, generator=torch.Generator().manual_seed(4))
    together = OPS.quant_linear(x, weight)
    alone = torch.cat([OPS.quant_linear(x[i:i + 1], weight) for i in range(11)])
    assert torch.equal(together, alone)
    assert torch.equal(together, with_threads(1, lambda: OPS.quant_linear(x, weight)))


def test_quant_linear_takes_strided_rows_and_leading_dims():
    weight = _packed("int4", 64, 128, 32)
    wide = torch.randn(6, 256, generator=torch.Generator().manual_seed(5))
    strided = wide[:, ::2]
    assert torch.equal(OPS.quant_linear(strided, weight), OPS.quant_linear(strided.contiguous(), weight))
    batched = wide[:, :128].reshape(2, 3, 128)
    assert OPS.quant_linear(batched, weight).shape == (2, 3, 64)
    assert torch.equal(OPS.quant_linear(batched, weight).reshape(6, 64), OPS.quant_linear(wide[:, :128], weight))
    assert OPS.quant_linear(torch.empty(0, 128), weight).shape == (0, 64)


@pytest.mark.parametrize("fmt", ["int4", "int8"])
def test_native_dequantize_gives_the_torch_bits(fmt):
    weight = _packed(fmt, 37, 192, 64)
    assert torch.equal(OPS.dequantize(weight), weight.dequantize())


def test_quant_linear_refuses_what_it_cannot_read():
    from gh200rt.formats.pack import quantize_fp8, quantize_int4
    with pytest.raises(ValueError, match="groups of a multiple of 32"):
        OPS.quant_linear(torch.randn(1, 48), quantize_int4(torch.randn(8, 48), 16))
    with pytest.raises(ValueError, match="int8 / int4"):
        OPS.quant_linear(torch.randn(1, 64), quantize_fp8(torch.randn(8, 64)))


def test_packed_weights_use_the_native_linear_up_to_its_row_limit():
    from gh200rt.backends.cpu.packed_linear import NATIVE_MAX_ROWS
    from gh200rt.formats.pack import quantize_int4
    weight = quantize_int4(torch.randn(48, 128, generator=torch.Generator().manual_seed(6)), 32)
    bias = torch.randn(48)
    x = torch.randn(NATIVE_MAX_ROWS + 3, 128, generator=torch.Generator().manual_seed(7))
    small = x[:NATIVE_MAX_ROWS]
    assert torch.equal(weight.linear(small, bias), OPS.quant_linear(small, weight) + bias)
    # above the limit: one native dequantize (the torch bits) and a float32 GEMM
    assert torch.equal(weight.linear(x), torch.nn.functional.linear(x, weight.dequantize()))


@pytest.mark.parametrize("n,k", [(203, 580), (8, 64), (7, 13), (1000, 576), (576, 1536)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_f32_linear_matches_f_linear(n, k, with_bias):
    """Ragged channel blocks (n % 8) and a K % 8 tail; float32 rounding of a sum in another order."""
    gen = torch.Generator().manual_seed(n + k)
    weight, x = torch.randn(n, k, generator=gen), torch.randn(5, k, generator=gen)
    bias = torch.randn(n, generator=gen) if with_bias else None
    got = OPS.f32_linear(x, weight, bias)
    torch.testing.assert_close(got, torch.nn.functional.linear(x, weight, bias), rtol=1e-5, atol=1e-4 * k ** 0.5)


def test_f32_linear_rows_threads_and_layout_do_not_change_a_rows_bits():
    """A row's bits depend on that row and the weight's values alone: alone or in a batch, on any thread count,
    from a strided weight view (a slot or slab) or a contiguous copy, 2-D or 3-D input."""
    gen = torch.Generator().manual_seed(21)
    weight, bias = torch.randn(1003, 576, generator=gen), torch.randn(1003, generator=gen)
    x = torch.randn(9, 576, generator=gen)
    together = OPS.f32_linear(x, weight, bias)
    assert torch.equal(together, torch.cat([OPS.f32_linear(x[i:i + 1], weight, bias) for i in range(9)]))
    assert torch.equal(together, with_threads(1, lambda: OPS.f32_linear(x, weight, bias)))
    assert torch.equal(together, with_threads(3, lambda: OPS.f32_linear(x, weight, bias)))
    slab = torch.randn(1003, 700, generator=gen)
    slab[:, 50:626] = weight
    assert torch.equal(together, OPS.f32_linear(x, slab[:, 50:626], bias))
    wide_x = torch.randn(9, 700, generator=gen)
    wide_x[:, 10:586] = x                                  # rows 700 apart, read in place
    assert torch.equal(together, OPS.f32_linear(wide_x[:, 10:586], weight, bias))
    assert torch.equal(together, OPS.f32_linear(torch.stack([x, x], -1)[..., 0], weight, bias))  # column stride 2
    assert torch.equal(together.view(3, 3, -1), OPS.f32_linear(x.view(3, 3, -1), weight, bias))
    assert OPS.f32_linear(x[:0], weight).shape == (0, 1003)


@pytest.mark.parametrize("n,k", [(203, 580), (8, 64), (7, 13), (1000, 576), (576, 1536), (3, 1)])
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 7, 8, 9, 12])
def test_f16_linear_has_f32_linears_bits_over_the_widened_weight(n, k, rows):
    """Every tile (one row x 8 channels, groups of up to 4 rows x 3 channels, the ragged ends, the K % 8 tail)
    runs f32_linear's operations over the exact float32 copy of the fp16 weight; fp16's extremes included."""
    gen = torch.Generator().manual_seed(n * k + rows)
    weight = torch.randn(n, k, generator=gen).half()
    extremes = torch.tensor([65504.0, -6.1e-5, 6e-8, -0.0]).half()   # largest, subnormals, -0
    weight.view(-1)[:4] = extremes[:weight.numel()]
    x, bias = torch.randn(rows, k, generator=gen), torch.randn(n, generator=gen)
    for b in (None, bias):
        got = OPS.f16_linear(x, weight, b)
        assert torch.equal(got, OPS.f32_linear(x, weight.float(), b))
        torch.testing.assert_close(got, torch.nn.functional.linear(x, weight.float(), b), rtol=1e-5,
                                   atol=1e-4 * k ** 0.5 * max(1.0, float(weight.float().abs().max())))


def test_f16_linear_rows_threads_and_layout_do_not_change_a_rows_bits():
    gen = torch.Generator().manual_seed(22)
    weight, bias = torch.randn(1003, 576, generator=gen).half(), torch.randn(1003, generator=gen)
    x = torch.randn(9, 576, generator=gen)
    together = OPS.f16_linear(x, weight, bias)
    assert torch.equal(together, torch.cat([OPS.f16_linear(x[i:i + 1], weight, bias) for i in range(9)]))
    assert torch.equal(together, with_threads(1, lambda: OPS.f16_linear(x, weight, bias)))
    assert torch.equal(together, with_threads(3, lambda: OPS.f16_linear(x, weight, bias)))
    slab = torch.randn(1003, 700, generator=gen).half()
    slab[:, 50:626] = weight
    assert torch.equal(together, OPS.f16_linear(x, slab[:, 50:626], bias))   # a strided view, read in place
    assert torch.equal(together.view(3, 3, -1), OPS.f16_linear(x.view(3, 3, -1), weight, bias))
    assert OPS.f16_linear(x[:0], weight).shape == (0, 1003)


def test_f16_linear_refuses_what_it_cannot_read():
    weight = torch.randn(16, 32).half()
    for x, w, b in [(torch.randn(2, 32), weight.float(), None), (torch.randn(2, 32).half(), weight, None),
                    (torch.randn(2, 32), weight.t().contiguous().t(), None), (torch.randn(2, 31), weight, None),
                    (torch.randn(2, 32), weight, torch.randn(15)),
                    (torch.randn(2, 32), weight, torch.randn(16).half())]:
        with pytest.raises(ValueError, match="f16_linear"):
            OPS.f16_linear(x, w, b)


def test_half_weight_takes_the_native_linear_for_a_few_rows():
    """Up to NATIVE_F16_MAX_ROWS rows the native fp16 linear (unless native is off), more rows fbgemm's GEMM."""
    gen = torch.Generator().manual_seed(23)
    half = HalfWeight(torch.randn(96, 64, generator=gen).half())
    bias = torch.randn(96, generator=gen)
    x = torch.randn(NATIVE_F16_MAX_ROWS + 1, 64, generator=gen)
    few = x[:NATIVE_F16_MAX_ROWS]
    assert torch.equal(half.linear(few, bias), OPS.f16_linear(few, half.weight, bias))
    assert torch.equal(half.linear(x[0], bias), OPS.f16_linear(x[:1], half.weight, bias)[0])   # a bare vector
    if fbgemm_fp16_available():
        piece, = fbgemm_form(half)
        fbgemm = torch.ops.quantized.linear_dynamic_fp16(x, piece) + bias
        assert torch.equal(half.linear(x, bias), fbgemm)
        assert torch.equal(half.linear(few, bias, native=False), fbgemm[:NATIVE_F16_MAX_ROWS])


@pytest.mark.skipif(not fbgemm_fp16_available(), reason="torch's fbgemm fp16 GEMM does not run here")
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("k", [64, 1536])
def test_a_tall_half_weight_packed_in_pieces_gives_the_whole_packs_bits(monkeypatch, k, threads):
    """A weight packed FBGEMM_PACK_ROWS rows at a time (outputs joined; the pieces one by one or side by side) gives
    what one packed copy gives: the pieces keep fbgemm's column tiles (a piece of 37 rows would not: a column in a
    partial tile gets other bits), the last one partial as the whole copy's last tile is."""
    gen = torch.Generator().manual_seed(29)
    weight = torch.randn(600, k, generator=gen).half()
    whole = torch.ops.quantized.linear_prepack_fp16(weight.float(), None)
    monkeypatch.setattr(half_linear, "FBGEMM_PACK_ROWS", 256)
    half = HalfWeight(weight)
    assert len(fbgemm_form(half, threads)) == 3
    for rows in (9, 64, 130):
        x = torch.randn(rows, k, generator=gen)
        assert torch.equal(half.linear(x), torch.ops.quantized.linear_dynamic_fp16(x, whole)), rows


def test_f32_linear_refuses_what_it_cannot_read():
    weight = torch.randn(16, 32)
    with pytest.raises(ValueError, match="f32_linear"):
        OPS.f32_linear(torch.randn(2, 32).bfloat16(), weight)
    with pytest.raises(ValueError, match="f32_linear"):
        OPS.f32_linear(torch.randn(2, 32), weight.t().contiguous().t())   # column stride 16
    with pytest.raises(ValueError, match="f32_linear"):
        OPS.f32_linear(torch.randn(2, 31), weight)
    with pytest.raises(ValueError, match="f32_linear"):
        OPS.f32_linear(torch.randn(2, 32), weight, torch.randn(15))


@pytest.mark.parametrize("n,k,group", [(203, 580, 128), (576, 1536, 128), (7, 13, 13), (40, 517, 16),
                                       (16, 256, 10 ** 6)])
def test_fp8_linear_gives_f32_linears_bits_over_the_dequantized_weight(n, k, group):
    """Codes and block scales read in place give what f32_linear gives over PackedWeight.dequantize, bit for bit
    (subnormal codes and a partial last block included), for every row count it takes, on any thread count."""
    weight = fp8_weight(n, k, group, n + k)
    dense = weight.dequantize()
    gen = torch.Generator().manual_seed(k)
    x, bias = torch.randn(8, k, generator=gen), torch.randn(n, generator=gen)
    for rows in (1, 2, 3, 5, 8):
        want = OPS.f32_linear(x[:rows], dense, bias)
        assert torch.equal(OPS.fp8_linear(x[:rows], weight.qweight, weight.scale, weight.group_size, bias), want)
    together = OPS.fp8_linear(x, weight.qweight, weight.scale, weight.group_size)
    assert torch.equal(together, with_threads(1, lambda: OPS.fp8_linear(x, weight.qweight, weight.scale,
                                                                         weight.group_size)))
    with pytest.raises(ValueError, match="group a multiple of 8"):
        OPS.fp8_linear(x, weight.qweight, weight.scale, 12)


def test_an_fp8_linear_of_a_decode_step_reads_the_codes_in_place(monkeypatch):
    """Through a layer on the native CPU ops: up to NATIVE_F32_MAX_ROWS rows never dequantize the weight and give the
    dequantized weight's bits (float32) or their rounding (bf16); more rows dequantize once, as before."""
    from gh200rt.backends.cpu.linear import NATIVE_F32_MAX_ROWS
    from gh200rt.backends.cpu.ops import use_native_cpu_kernels
    from gh200rt.formats.packed_weight import PackedWeight
    from gh200rt.models.layers.linear import RefLinear
    weight = fp8_weight(96, 256, 128, 3)
    dense = weight.dequantize()
    layer = RefLinear(256, 96, True, torch.float32)
    torch.nn.init.normal_(layer.bias)
    layer.weight_ref.current = weight
    assert use_native_cpu_kernels(layer) is None
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(NATIVE_F32_MAX_ROWS + 1, 256, generator=gen)
    many = layer(x)                                   # dequantized once
    assert torch.equal(many, layer.dense_fn(x, dense, layer.bias))

    def refuse(self):
        raise AssertionError("a decode step's fp8 linear dequantized its weight")
    monkeypatch.setattr(PackedWeight, "dequantize", refuse)
    few = x[:NATIVE_F32_MAX_ROWS]
    assert torch.equal(layer(few), OPS.f32_linear(few, dense, layer.bias))
    assert torch.equal(layer(few.bfloat16()), OPS.f32_linear(few.bfloat16().float(), dense, layer.bias).bfloat16())
