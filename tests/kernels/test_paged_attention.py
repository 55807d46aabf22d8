"""Paged attention (Triton, interpreted here) against the gather-then-attend torch reference."""
import pytest
import torch

from gh200rt.kernels.triton.paged_attention import paged_attention, reference_paged_attention
from gh200rt.kernels.triton.store_kv import write_kv
from tests.kernels.paged_cases import scattered_case

pytestmark = pytest.mark.interpreter


def build_case(query_lens, seq_lens, heads, kv_heads, d, block_size, dtype, seed, store=write_kv):
    """A scattered case on the CPU whose new tokens' K/V are written by ``store``: the Triton store (interpreted),
    as a model step does, or its torch reference where the case only feeds a compiled kernel on a GPU host."""
    q, pool, meta, gen = scattered_case(query_lens, seq_lens, heads, kv_heads, d, block_size, dtype, seed)
    k = torch.randn(meta.num_tokens, kv_heads, d, generator=gen).to(dtype)
    v = torch.randn(meta.num_tokens, kv_heads, d, generator=gen).to(dtype)
    store(pool, k, v, meta.slot_mapping)
    return q, pool, meta


CASES = [
    ("decode", [1, 1, 1], [1, 17, 40]),
    ("prefill", [7], [7]),
    ("prefix-cached prefill + decode", [5, 1, 20], [37, 16, 20]),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name,query_lens,seq_lens", CASES)
@pytest.mark.parametrize("heads,kv_heads,d,block_size", [(9, 3, 64, 16), (4, 4, 24, 8)])
def test_paged_attention(dtype, name, query_lens, seq_lens, heads, kv_heads, d, block_size):
    q, pool, meta = build_case(query_lens, seq_lens, heads, kv_heads, d, block_size, dtype, seed=len(name) + d)
    scale = d ** -0.5
    got = paged_attention(q, pool, meta, scale, kv_heads)
    want = reference_paged_attention(q, pool, meta, scale, kv_heads)
    err = (got.float() - want.float()).abs().max().item()
    print(f"paged_attention {name} {dtype} heads={heads}/{kv_heads} D={d} block={block_size}: worst error {err:.2e}")
    assert err < {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 2e-3}[dtype]


def test_reference_matches_dense_causal_attention():
    """The reference itself, against torch SDPA on contiguous K/V (so a shared bug cannot hide)."""
    q, pool, meta = build_case([6], [6], 4, 2, 16, 4, torch.float32, seed=1)
    want = reference_paged_attention(q, pool, meta, 0.25, 2)
    blocks = meta.block_tables[0].long()
    k = pool[0, blocks].reshape(-1, 2, 16)[:6].repeat_interleave(2, dim=1)
    v = pool[1, blocks].reshape(-1, 2, 16)[:6].repeat_interleave(2, dim=1)
    sdpa = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=True, scale=0.25).transpose(0, 1)
    assert (sdpa - want).abs().max().item() < 1e-5


def test_same_contract_as_the_models_torch_attention():
    """Drop-in for gh200rt.kv.attention (the models' attention_fn): same call, same result."""
    from gh200rt.kv import attention as torch_attention
    q, pool, meta = build_case([3, 1], [19, 33], 9, 3, 64, 16, torch.float32, seed=5)
    want = torch_attention.paged_attention(q, pool, meta, 0.125, 3)
    got = paged_attention(q, pool, meta, 0.125, 3)
    err = (got - want).abs().max().item()
    print(f"Triton vs gh200rt.kv.attention: worst error {err:.2e}")
    assert err < 1e-5


# decodes at contexts either side of a 64-key tile and of two, and a 3-token prefill chunk ending at 130 keys
TILE_EDGE_QUERY_LENS, TILE_EDGE_SEQ_LENS = [1] * 5 + [3], [1, 15, 17, 63, 65, 130]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("group", [1, 4, 8])  # query heads a KV head serves: padded to the dot's 16 rows
@pytest.mark.parametrize("block_size", [16, 32])  # tiles of 4 and of 2 blocks
def test_contexts_that_end_inside_a_tile(dtype, group, block_size):
    kv_heads, d = 2, 64
    q, pool, meta = build_case(TILE_EDGE_QUERY_LENS, TILE_EDGE_SEQ_LENS, group * kv_heads, kv_heads, d, block_size,
                               dtype, seed=group + block_size)
    got = paged_attention(q, pool, meta, d ** -0.5, kv_heads, num_splits=1)
    want = reference_paged_attention(q, pool, meta, d ** -0.5, kv_heads)
    err = (got.float() - want.float()).abs().max().item()
    print(f"tile edges {dtype} group={group} block={block_size}: worst error {err:.2e}")
    assert err < {torch.float32: 1e-5, torch.bfloat16: 2e-2}[dtype]
