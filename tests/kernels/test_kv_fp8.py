"""The fp8 KV cache in the Triton kernels (interpreted here) against the torch path (kv/fp8.py,
kv/attention.py): store_kv writes the bytes torch's float8 conversion gives, paged attention reads
them back through the layer's scales, at every block-size edge."""
import pytest
import torch

from gh200rt.kernels.triton.paged_attention import paged_attention, reference_paged_attention
from gh200rt.kernels.triton.store_kv import reference_write_kv, write_kv
from gh200rt.kv import attention as torch_attention
from gh200rt.kv import fp8
from tests.kernels.test_paged_attention import TILE_EDGE_QUERY_LENS, TILE_EDGE_SEQ_LENS, build_case

pytestmark = pytest.mark.interpreter
FP8 = [torch.float8_e4m3fn, torch.float8_e5m2]


def grid_and_ties(dtype: torch.dtype) -> torch.Tensor:
    """Every finite value of ``dtype``, the midpoints between neighbours (ties: to even), values just
    either side of each midpoint, and values past the largest (saturate)."""
    values = torch.arange(256, dtype=torch.uint8).view(dtype).float()
    values = values[values.isfinite()].unique()
    mids = (values[1:] + values[:-1]) / 2
    nudge = mids.abs() * 2.0 ** -20 + 2.0 ** -40
    big = torch.finfo(dtype).max
    return torch.cat([values, mids, mids + nudge, mids - nudge, torch.tensor([big * 1.01, -big * 3, 1e30, -1e30])])


@pytest.mark.parametrize("dtype", FP8, ids=str)
def test_store_kv_rounds_like_torch_at_every_tie_and_saturates(dtype):
    x = grid_and_ties(dtype)
    heads, d = 1, 64
    rows = -(-len(x) // d)
    x = torch.cat([x, torch.zeros(rows * d - len(x))]).view(rows, heads, d)
    pool = torch.zeros(2, rows, 1, heads, d, dtype=dtype)
    want = torch.zeros_like(pool)
    scale = torch.tensor([1.0, 0.5])
    slots = torch.arange(rows)
    write_kv(pool, x, -x, slots, scale)
    reference_write_kv(want, x, -x, slots, scale)
    bad = (pool.view(torch.uint8) != want.view(torch.uint8)).sum().item()
    print(f"store_kv {dtype}: {bad} of {pool.numel()} bytes differ from torch's conversion")
    assert bad == 0
    assert pool.float().isfinite().all(), "saturation, never NaN"


@pytest.mark.parametrize("dtype", FP8, ids=str)
@pytest.mark.parametrize("src", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("heads,d", [(3, 24), (9, 128)])  # one masked chunk; two chunks of 1024
def test_store_kv_fp8_matches_reference(dtype, src, heads, d):
    gen = torch.Generator().manual_seed(heads + d)
    t = 7
    k, v = (torch.randn(t, heads, d, generator=gen) * 3).to(src), (torch.randn(t, heads, d, generator=gen)).to(src)
    slots = torch.tensor([5, -1, 0, 11, 2, -1, 8])  # padding rows are skipped
    scale = torch.tensor([0.02, 0.01])
    got, want, torch_path = (torch.zeros(2, 3, 4, heads, d, dtype=dtype) for _ in range(3))
    write_kv(got, k, v, slots, scale)
    reference_write_kv(want, k, v, slots, scale)
    torch_attention.write_kv(torch_path, k[slots >= 0], v[slots >= 0], slots[slots >= 0], scale)
    assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))
    assert torch.equal(torch_path.view(torch.uint8), want.view(torch.uint8))


def fp8_case(query_lens, seq_lens, heads, kv_heads, d, block_size, q_dtype, kv_dtype, seed):
    # the torch store: these CPU tensors also feed the compiled kernels of tests/gpu/test_gpu_fp8.py
    q, pool, meta = build_case(query_lens, seq_lens, heads, kv_heads, d, block_size, torch.float32, seed,
                               store=reference_write_kv)
    scale = torch.tensor([0.015, 0.008])
    fp8_pool = torch.zeros(pool.shape, dtype=kv_dtype)
    every = torch.arange(pool.shape[1] * block_size)
    flat = pool.view(2, -1, kv_heads, d)
    reference_write_kv(fp8_pool, flat[0], flat[1], every, scale)  # K/V around 1/scale's range: the fp8 grid matters
    return q.to(q_dtype), fp8_pool, meta, scale


# each block size with sequences ending one before, on, and one past a block boundary
EDGES = [(bs, [1] * 3 + [3], [max(1, bs - 1), bs, bs + 1, 2 * bs + 1]) for bs in (1, 8, 16, 32)]


@pytest.mark.parametrize("kv_dtype", FP8, ids=str)
@pytest.mark.parametrize("q_dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("block_size,query_lens,seq_lens", EDGES)
@pytest.mark.parametrize("heads,kv_heads,d", [(9, 3, 40), (4, 4, 64)])
def test_paged_attention_fp8_matches_references(kv_dtype, q_dtype, block_size, query_lens, seq_lens, heads,
                                                kv_heads, d):
    q, pool, meta, scale = fp8_case(query_lens, seq_lens, heads, kv_heads, d, block_size, q_dtype, kv_dtype,
                                    seed=block_size + d)
    got = paged_attention(q, pool, meta, d ** -0.5, kv_heads, scale)
    want = reference_paged_attention(q, pool, meta, d ** -0.5, kv_heads, scale)
    cpu_path = torch_attention.paged_attention(q, pool, meta, d ** -0.5, kv_heads, scale)
    err = (got.float() - want.float()).abs().max().item()
    cpu_err = (cpu_path.float() - want.float()).abs().max().item()
    print(f"fp8 attention {kv_dtype} q={q_dtype} block={block_size} heads={heads}/{kv_heads} D={d}: "
          f"Triton {err:.2e}, torch path {cpu_err:.2e}")
    tol = 1e-5 if q_dtype == torch.float32 else 2e-2
    assert err < tol and cpu_err < tol


@pytest.mark.parametrize("kv_dtype", FP8, ids=str)
@pytest.mark.parametrize("group", [1, 4, 8])
@pytest.mark.parametrize("block_size", [16, 32])
def test_paged_attention_fp8_at_tile_edges(kv_dtype, group, block_size):
    q, pool, meta, scale = fp8_case(TILE_EDGE_QUERY_LENS, TILE_EDGE_SEQ_LENS, group * 2, 2, 64, block_size,
                                    torch.float32, kv_dtype, seed=group + block_size)
    got = paged_attention(q, pool, meta, 64 ** -0.5, 2, scale, num_splits=1)
    want = reference_paged_attention(q, pool, meta, 64 ** -0.5, 2, scale)
    err = (got.float() - want.float()).abs().max().item()
    print(f"fp8 attention at tile edges {kv_dtype} group={group} block={block_size}: worst error {err:.2e}")
    assert err < 1e-5


def test_torch_path_reads_exactly_the_dequantized_values():
    """An fp8 pool read through its scales gives what a float32 pool holding the dequantized values gives."""
    q, pool, meta, scale = fp8_case([4, 1], [21, 9], 4, 2, 16, 8, torch.float32, torch.float8_e4m3fn, seed=2)
    dense = torch.stack([pool[0].float() * scale[0], pool[1].float() * scale[1]])
    got = torch_attention.paged_attention(q, pool, meta, 0.25, 2, scale)
    assert torch.equal(got, torch_attention.paged_attention(q, dense, meta, 0.25, 2))


def test_scales_only_matter_for_fp8_and_are_applied():
    q, pool, meta, scale = fp8_case([1], [20], 4, 2, 16, 8, torch.float32, torch.float8_e4m3fn, seed=3)
    doubled_v = torch.tensor([scale[0].item(), 2 * scale[1].item()])
    base = paged_attention(q, pool, meta, 0.25, 2, scale)
    assert torch.allclose(paged_attention(q, pool, meta, 0.25, 2, doubled_v), 2 * base, rtol=1e-6, atol=1e-7)


def test_calculated_scales_use_the_whole_range():
    k, v = torch.randn(5, 2, 8) * 7, torch.zeros(5, 2, 8)
    scales = fp8.calculated_scales(k, v, torch.float8_e4m3fn)
    assert torch.allclose(scales[0] * 448, k.abs().max()) and scales[1] == 1.0
    stored = fp8.quantize(k, scales[0], torch.float8_e4m3fn).float()
    assert stored.abs().max() == 448 and stored.isfinite().all()


def test_kv_cache_dtype_flag():
    assert fp8.kv_cache_dtype("auto", torch.bfloat16) is torch.bfloat16
    assert fp8.kv_cache_dtype("fp8", torch.bfloat16) is torch.float8_e4m3fn
    assert fp8.kv_cache_dtype("fp8_e5m2", torch.float32) is torch.float8_e5m2
    with pytest.raises(ValueError, match="choose one of auto, fp8"):
        fp8.kv_cache_dtype("int8", torch.float32)


def test_the_fp8_case_launches_no_triton_kernel_so_gpu_hosts_can_build_it():
    """On a GPU host Triton compiles instead of interpreting, and a compiled kernel cannot take CPU tensors: the
    case tests/gpu/test_gpu_fp8.py feeds to the compiled attention must be built in plain torch. Here that host
    is stood in for by a process with the interpreter off (launching a kernel there fails)."""
    import subprocess
    import sys
    from pathlib import Path
    probe = ("import torch; from tests.kernels.test_kv_fp8 import fp8_case; "
             "fp8_case([1, 3], [9, 20], 4, 2, 16, 8, torch.bfloat16, torch.float8_e4m3fn, seed=1); print('built')")
    root = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in __import__("os").environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-c", probe], cwd=root, env={**env, "TRITON_INTERPRET": "0"},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "built" in proc.stdout, proc.stderr[-2000:]
