"""gh200rt.kv.attention against dense causal attention, for a batch mixing prefill, chunked prefill and decode."""
import pytest
import torch

from gh200rt.kv.attention import paged_attention, write_kv
from gh200rt.models.base import AttentionMetadata


def dense_reference(q, k, v, query_len, scale):
    """q [Q,H,D] are the last Q of k/v's S positions; causal."""
    seq = k.shape[0]
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
    scores = torch.einsum("qhd,shd->hqs", q, k) * scale
    qpos = torch.arange(seq - query_len, seq)[:, None]
    scores = scores.masked_fill(torch.arange(seq)[None, :] > qpos, float("-inf"))
    return torch.einsum("hqs,shd->qhd", scores.softmax(-1), v)


@pytest.mark.parametrize("query_lens,seq_lens", [([1, 1, 1], [5, 17, 9]), ([7, 1, 3], [7, 12, 20]), ([1], [1])])
@pytest.mark.parametrize("heads,kv_heads", [(4, 2), (3, 3)])
def test_paged_matches_dense(query_lens, seq_lens, heads, kv_heads):
    torch.manual_seed(0)
    block, dim, num_blocks = 4, 8, 32
    cache = torch.zeros(2, num_blocks, block, kv_heads, dim)
    free = list(torch.randperm(num_blocks - 1) + 1)
    tables, ks, vs = [], [], []
    for s in seq_lens:
        tables.append([int(free.pop()) for _ in range(-(-s // block))])
        ks.append(torch.randn(s, kv_heads, dim))
        vs.append(torch.randn(s, kv_heads, dim))
    # the cached prefix is already in the pool; the new tokens are written by write_kv
    prefix = AttentionMetadata.build([s - q for q, s in zip(query_lens, seq_lens) if s > q],
                                     [s - q for q, s in zip(query_lens, seq_lens) if s > q],
                                     [t for t, q, s in zip(tables, query_lens, seq_lens) if s > q], block)
    if prefix.num_seqs:
        write_kv(cache, torch.cat([k[:s - q] for k, q, s in zip(ks, query_lens, seq_lens) if s > q]),
                 torch.cat([v[:s - q] for v, q, s in zip(vs, query_lens, seq_lens) if s > q]), prefix.slot_mapping)
    meta = AttentionMetadata.build(query_lens, seq_lens, tables, block)
    write_kv(cache, torch.cat([k[s - q:] for k, q, s in zip(ks, query_lens, seq_lens)]),
             torch.cat([v[s - q:] for v, q, s in zip(vs, query_lens, seq_lens)]), meta.slot_mapping)
    q = torch.randn(sum(query_lens), heads, dim)
    out = paged_attention(q, cache, meta, dim ** -0.5, kv_heads)
    start = 0
    for b, (ql, s) in enumerate(zip(query_lens, seq_lens)):
        ref = dense_reference(q[start:start + ql], ks[b], vs[b], ql, dim ** -0.5)
        worst = (out[start:start + ql] - ref).abs().max().item()
        assert worst < 1e-5, f"sequence {b}: worst mismatch {worst}"
        start += ql
