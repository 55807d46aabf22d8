"""rmsnorm, rope, silu_mul and store_kv (Triton, interpreted here) against their torch references."""
import pytest
import torch

from gh200rt.kernels.triton.rmsnorm import fused_add_rmsnorm, reference_fused_add_rmsnorm
from gh200rt.kernels.triton.rope import apply_rope, build_cos_sin_cache, reference_rope
from gh200rt.kernels.triton.silu_mul import reference_silu_mul, silu_mul
from gh200rt.kernels.triton.store_kv import reference_write_kv, write_kv

pytestmark = pytest.mark.interpreter

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def tol(dtype):
    return {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 2e-3}[dtype]


def worst(got, want):
    """Worst absolute error relative to the largest reference value (at least 1): one output ulp apart."""
    return (got.float() - want.float()).abs().max().item() / max(1.0, want.float().abs().max().item())


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("t,h", [(1, 576), (5, 100)])
@pytest.mark.parametrize("with_residual", [True, False])
def test_rmsnorm(dtype, t, h, with_residual):
    gen = torch.Generator().manual_seed(h + t)
    x = torch.randn(t, h, generator=gen).to(dtype)
    res = torch.randn(t, h, generator=gen).to(dtype) if with_residual else None
    w = (1 + 0.1 * torch.randn(h, generator=gen)).to(dtype)
    y, r = fused_add_rmsnorm(x, res, w, 1e-5)
    y_ref, r_ref = reference_fused_add_rmsnorm(x, res, w, 1e-5)
    err_y, err_r = worst(y, y_ref), worst(r, r_ref)
    print(f"rmsnorm {dtype} T={t} H={h} residual={with_residual}: worst relative error y {err_y:.2e} residual {err_r:.2e}")
    assert err_y <= tol(dtype) * 4 and err_r <= tol(dtype) * 4


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads,kv_heads,d", [(9, 3, 64), (5, 1, 24)])
def test_rope(dtype, heads, kv_heads, d):
    gen = torch.Generator().manual_seed(heads * d)
    t = 7
    q = torch.randn(t, heads, d, generator=gen).to(dtype)
    k = torch.randn(t, kv_heads, d, generator=gen).to(dtype)
    positions = torch.tensor([0, 1, 5, 17, 100, 3, 255])
    cache = build_cos_sin_cache(d, 256)
    q_rot, k_rot = apply_rope(q, k, positions, cache)
    q_ref, k_ref = reference_rope(q, k, positions, cache)
    err = max(worst(q_rot, q_ref), worst(k_rot, k_ref))
    print(f"rope {dtype} heads={heads}/{kv_heads} D={d}: worst relative error {err:.2e}")
    assert err <= tol(dtype) * 4
    assert not torch.equal(q_rot, q)  # positions > 0 really rotate


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("t,inter", [(1, 1536), (3, 1100)])
def test_silu_mul(dtype, t, inter):
    gen = torch.Generator().manual_seed(inter)
    x = (3 * torch.randn(t, 2 * inter, generator=gen)).to(dtype)
    got, want = silu_mul(x), reference_silu_mul(x)
    err = worst(got, want)
    print(f"silu_mul {dtype} T={t} I={inter}: worst relative error {err:.2e}")
    assert got.shape == (t, inter) and err <= tol(dtype) * 10


def test_silu_mul_rejects_odd_width():
    with pytest.raises(ValueError, match="even"):
        silu_mul(torch.randn(2, 5))


@pytest.mark.parametrize("dtype", DTYPES)
def test_write_kv(dtype):
    gen = torch.Generator().manual_seed(3)
    pool = torch.randn(2, 6, 16, 3, 20, generator=gen).to(dtype)
    k = torch.randn(5, 3, 20, generator=gen).to(dtype)
    v = torch.randn(5, 3, 20, generator=gen).to(dtype)
    slots = torch.tensor([0, 17, 95, -1, 40])  # -1: a padding row that must not be written
    want = pool.clone()
    reference_write_kv(want, k, v, slots)
    write_kv(pool, k, v, slots)
    print(f"write_kv {dtype}: {int((pool != want).sum())} differing elements")
    assert torch.equal(pool, want)


@pytest.mark.parametrize("dtype", DTYPES)
def test_write_kv_into_the_arenas_strided_layer_view(dtype):
    """The device arena's layer view (blocks block-major across layers): the kernel and the torch path write
    exactly the slots the reference writes there, and nothing of the neighbouring layers."""
    from gh200rt.kv.arena import DeviceArena
    from gh200rt.kv.attention import write_kv as torch_write_kv
    gen = torch.Generator().manual_seed(4)
    arena = DeviceArena(6, 3, 16, 3, 20, dtype)
    arena.buffer.view(dtype).copy_(torch.randn(arena.buffer.numel() // dtype.itemsize, generator=gen).to(dtype))
    k = torch.randn(5, 3, 20, generator=gen).to(dtype)
    v = torch.randn(5, 3, 20, generator=gen).to(dtype)
    slots = torch.tensor([0, 17, 95, -1, 40])
    before = arena.buffer.clone()
    want = [c.clone() for c in arena.kv_caches()]
    reference_write_kv(want[1], k, v, slots)
    write_kv(arena.kv_caches()[1], k, v, slots)
    got = arena.kv_caches()
    assert not got[1].is_contiguous() and torch.equal(got[1], want[1])
    assert torch.equal(got[0], want[0]) and torch.equal(got[2], want[2])
    arena.buffer.copy_(before)
    keep = slots >= 0
    torch_write_kv(arena.kv_caches()[1], k[keep], v[keep], slots[keep])
    assert all(torch.equal(g, w) for g, w in zip(arena.kv_caches(), want))
