"""Paged-attention inputs shared by the kernel and torch attention tests: a pool whose blocks are scattered
(block 0 left as the tables' padding), the step's metadata and its queries."""
import random

import torch

from gh200rt.models.base import AttentionMetadata


def scattered_case(query_lens, seq_lens, heads, kv_heads, d, block_size, dtype, seed):
    """(q, pool, meta, generator): the generator goes on where the case left off, for K/V a test writes."""
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    needed = [-(-s // block_size) for s in seq_lens]
    ids = list(range(1, sum(needed) + 3))
    rng.shuffle(ids)
    tables, at = [], 0
    for n in needed:
        tables.append(ids[at:at + n])
        at += n
    pool = torch.randn(2, len(ids) + 1, block_size, kv_heads, d, generator=gen).to(dtype)
    meta = AttentionMetadata.build(query_lens, seq_lens, tables, block_size)
    q = torch.randn(meta.num_tokens, heads, d, generator=gen).to(dtype)
    return q, pool, meta, gen
