"""RoPE and the KV store in one launch (Triton, interpreted here) against the model's rotate-then-store ops."""
import pytest
import torch

from gh200rt.kernels.triton.rope_store_kv import heads_per_iteration, reference_rope_and_store_kv, rope_and_store_kv

pytestmark = pytest.mark.interpreter

TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 2e-3}


def case(t, heads, kv_heads, d, dtype, pool_dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    qkv = torch.randn(t, (heads + 2 * kv_heads) * d, generator=gen).to(dtype)
    angles = torch.rand(t, 1, d // 2, generator=gen) * 6.3
    pool = torch.randn(2, 6, 8, kv_heads, d, generator=gen).to(pool_dtype)
    slots = torch.tensor([3, 17, -1, 40, 9, 47, 0][:t])  # -1: a padding row that must not be written
    return qkv, angles.cos().to(dtype), angles.sin().to(dtype), pool, slots


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("heads,kv_heads,d", [(9, 3, 64), (20, 4, 128), (4, 4, 24)])
def test_matches_rotate_then_store(dtype, heads, kv_heads, d):
    qkv, cos, sin, pool, slots = case(7, heads, kv_heads, d, dtype, dtype, seed=heads * d)
    want_pool = pool.clone()
    want_q = reference_rope_and_store_kv(qkv, cos, sin, want_pool, slots, heads, kv_heads)
    q = rope_and_store_kv(qkv, cos, sin, pool, slots, heads, kv_heads)
    q_err = (q.float() - want_q.float()).abs().max().item()
    pool_err = (pool.float() - want_pool.float()).abs().max().item()
    print(f"rope+store {dtype} heads={heads}/{kv_heads} D={d}: q error {q_err:.2e}, pool error {pool_err:.2e}")
    assert q.shape == (7, heads, d) and q_err <= TOL[dtype] * 4 and pool_err <= TOL[dtype] * 4
    untouched = torch.ones(2, 6 * 8, dtype=torch.bool)
    untouched[:, slots[slots >= 0]] = False
    flat, before = pool.view(2, 48, -1), case(7, heads, kv_heads, d, dtype, dtype, seed=heads * d)[3].view(2, 48, -1)
    assert torch.equal(flat[untouched], before[untouched]), "only the tokens' slots are written"
    assert not torch.equal(q, qkv[:, :heads * d].view(7, heads, d)), "the angles really rotate"


@pytest.mark.parametrize("pool_dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_fp8_pool_is_quantized_with_the_layer_scales(pool_dtype, dtype):
    qkv, cos, sin, pool, slots = case(5, 8, 2, 32, dtype, torch.float32, seed=5)
    pool = pool.to(pool_dtype)
    scale = torch.tensor([0.03, 0.05])
    want_pool = pool.clone()
    want_q = reference_rope_and_store_kv(qkv, cos, sin, want_pool, slots, 8, 2, scale)
    q = rope_and_store_kv(qkv, cos, sin, pool, slots, 8, 2, scale)
    assert (q.float() - want_q.float()).abs().max().item() <= TOL[dtype] * 4
    differ = (pool.view(torch.uint8) != want_pool.view(torch.uint8)).sum().item()
    ulp = {torch.float8_e4m3fn: 2 ** -3, torch.float8_e5m2: 2 ** -2}[pool_dtype]
    rel = ((pool.float() - want_pool.float()).abs() / want_pool.float().abs().clamp_min(1e-3)).max().item()
    print(f"fp8 {pool_dtype} from {dtype}: {differ} bytes differ from the reference, worst relative {rel:.2e}")
    assert rel <= ulp and differ <= 2, "at most a rounding tie apart from the float32 reference"


def test_heads_per_iteration_keeps_tiles_small():
    assert heads_per_iteration(32, 64) == 16 and heads_per_iteration(3, 32) == 4 and heads_per_iteration(64, 512) == 2
    assert heads_per_iteration(1, 2048) == 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("heads,kv_heads,d", [(8, 2, 32), (20, 4, 128)])
def test_qwen3_qk_norms_before_the_rotation(dtype, heads, kv_heads, d):
    qkv, cos, sin, pool, slots = case(6, heads, kv_heads, d, dtype, dtype, seed=7 + d)
    qkv = qkv * 5  # far from unit RMS, so a missing norm shows
    gen = torch.Generator().manual_seed(1)
    norms = ((1 + 0.3 * torch.randn(d, generator=gen)).to(dtype), (1 + 0.3 * torch.randn(d, generator=gen)).to(dtype),
             1e-6)
    want_pool = pool.clone()
    want_q = reference_rope_and_store_kv(qkv, cos, sin, want_pool, slots, heads, kv_heads, qk_norm=norms)
    q = rope_and_store_kv(qkv, cos, sin, pool, slots, heads, kv_heads, qk_norm=norms)
    q_err = (q.float() - want_q.float()).abs().max().item()
    pool_err = (pool.float() - want_pool.float()).abs().max().item()
    print(f"rope+store with q/k norms {dtype} heads={heads}/{kv_heads} D={d}: q {q_err:.2e}, pool {pool_err:.2e}")
    assert q_err <= TOL[dtype] * 8 and pool_err <= TOL[dtype] * 8
    unnormed = reference_rope_and_store_kv(qkv, cos, sin, pool.clone(), slots, heads, kv_heads)
    assert (unnormed.float() - want_q.float()).abs().max().item() > 1.0
