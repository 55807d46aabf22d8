"""Each mask form of the CPU paged attention (gh200rt/kv/attention.py) against the gather-then-attend
reference, and against the fully masked form bit for bit: a sequence's output must not depend on
which form its batch mates select (invariance of batched, chunked and one-at-a-time runs)."""
import pytest
import torch

from gh200rt.kernels.triton.paged_attention import reference_paged_attention
from gh200rt.kv import attention
from gh200rt.kv.attention import paged_attention, write_kv
from gh200rt.models.base import AttentionMetadata
from tests.kernels.paged_cases import scattered_case

# (query_lens, seq_lens) per form; block size 8, so 7/8/9 and 16/17 sit on block boundaries
FORMS = {
    "decodes, one length": ([1, 1, 1], [17, 17, 17]),
    "decodes, one length on a block edge": ([1, 1], [16, 16]),
    "decodes, mixed lengths": ([1, 1, 1, 1], [7, 8, 9, 33]),
    "prompts, one length (is_causal, no padding)": ([9, 9], [9, 9]),
    "prompts, mixed lengths (is_causal, padded)": ([3, 16, 17, 1], [3, 16, 17, 1]),
    "chunks after a cached prefix (additive mask)": ([5, 8], [21, 8]),
    "decodes next to a prompt and a chunk": ([1, 12, 1, 4], [30, 12, 9, 17]),
}
HEADS = [(9, 3, 64), (4, 4, 24)]


def build(query_lens, seq_lens, heads, kv_heads, d, dtype, seed, block_size=8):
    return scattered_case(query_lens, seq_lens, heads, kv_heads, d, block_size, dtype, seed)[:3]


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("heads,kv_heads,d", HEADS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_each_mask_form_matches_the_reference(form, heads, kv_heads, d, dtype):
    q, pool, meta = build(*FORMS[form], heads, kv_heads, d, dtype, seed=d)
    got = paged_attention(q, pool, meta, d ** -0.5, kv_heads)
    want = reference_paged_attention(q, pool, meta, d ** -0.5, kv_heads)
    worst = (got.float() - want.float()).abs().max().item()
    tol = 2e-6 if dtype == torch.float32 else 2e-2
    assert worst < tol, f"{form}, {dtype}, heads {heads}/{kv_heads}: worst mismatch {worst:.2e}"


@pytest.mark.parametrize("kv_dtype", [torch.float8_e4m3fn, torch.float8_e5m2], ids=str)
@pytest.mark.parametrize("form", FORMS)
def test_fp8_pool_in_each_form(kv_dtype, form):
    q, pool, meta = build(*FORMS[form], 9, 3, 64, torch.float32, seed=3)
    scale = torch.tensor([0.02, 0.01])
    fp8_pool = torch.zeros(pool.shape, dtype=kv_dtype)
    flat = pool.view(2, -1, 3, 64)
    write_kv(fp8_pool, flat[0] * 0.02, flat[1] * 0.01, torch.arange(flat.shape[1]), scale)
    got = paged_attention(q, fp8_pool, meta, 0.125, 3, scale)
    want = reference_paged_attention(q, fp8_pool, meta, 0.125, 3, scale)
    worst = (got - want).abs().max().item()
    assert worst < 1e-5, f"{form}, {kv_dtype}: worst mismatch {worst:.2e}"


def masked_everywhere(q, pool, meta, scale, kv_heads):
    """The same groups, each given the full additive mask (the form every step used before)."""
    layout = attention._layout(meta)
    for group in layout.groups:
        seqs = [b for b in range(meta.num_seqs) if (meta.query_lens_list[b] == 1) == group.decode]
        lens = torch.tensor([meta.seq_lens_list[b] for b in seqs])
        first_new = lens - torch.tensor([meta.query_lens_list[b] for b in seqs])
        key_pos = torch.arange(group.blocks.numel() // group.num_seqs * meta.block_size)
        query_pos = first_new[:, None] + torch.arange(group.max_query)[None, :]
        group._allowed = (key_pos[None, None, :] <= query_pos[:, :, None])[:, None, :, :]
        group._masks, group.causal = {}, False
    return paged_attention(q, pool, meta, scale, kv_heads)


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_unmasked_forms_are_bit_identical_to_the_masked_one(form, dtype):
    q, pool, meta = build(*FORMS[form], 9, 3, 64, dtype, seed=7)
    fast = paged_attention(q, pool, meta, 0.125, 3)
    meta = AttentionMetadata.build(meta.query_lens_list, meta.seq_lens_list, meta.block_tables.tolist(), 8)
    masked = masked_everywhere(q, pool, meta, 0.125, 3)
    assert torch.equal(fast, masked), f"{form}: worst difference {(fast - masked).abs().max().item():.2e}"
