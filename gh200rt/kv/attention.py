"""Plain-torch attention over the paged KV pool (the reference the Triton kernel must match).

``kv_cache``: ``[2, num_blocks, block_size, num_kv_heads, head_dim]``. A sequence's new tokens are the
last ``query_len`` of its ``seq_len`` positions, so query i of sequence b sits at position
``seq_len - query_len + i`` and sees every cached key at or before it (causal within the new
tokens, full over the cached prefix). All sequences are handled in one batched call: contexts are
gathered through the block tables, padded to the longest, and masked.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from gh200rt.models.base import AttentionMetadata

_LAYOUT_KEY = "_torch_paged_attention_layout"


def write_kv(kv_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Store new K/V ``[T, num_kv_heads, head_dim]`` at their flat pool slots."""
    num_kv_heads, head_dim = kv_cache.shape[-2], kv_cache.shape[-1]
    kv_cache[0].view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, k.to(kv_cache.dtype))
    kv_cache[1].view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, v.to(kv_cache.dtype))


class _BatchLayout:
    """Index tensors shared by every layer of one step (built once per AttentionMetadata)."""

    def __init__(self, meta: AttentionMetadata):
        device = meta.slot_mapping.device
        max_len = max(meta.seq_lens_list)
        blocks = -(-max_len // meta.block_size)
        # index_select on a flat block list: several times faster on CPU than advanced indexing
        self.blocks = meta.block_tables[:, :blocks].reshape(-1).long()
        self.decode_only = meta.is_decode_only
        self.max_query = max(meta.query_lens_list)
        key_pos = torch.arange(blocks * meta.block_size, device=device)
        if self.decode_only:
            self.mask = (key_pos[None, :] < meta.seq_lens[:, None])[:, None, None, :]
            return
        # row of each new token in the padded [B * max_query] query layout
        rows = [b * self.max_query + i for b, q in enumerate(meta.query_lens_list) for i in range(q)]
        self.padded_rows = torch.tensor(rows, dtype=torch.long, device=device)
        first_new = torch.tensor([s - q for q, s in zip(meta.query_lens_list, meta.seq_lens_list)], device=device)
        query_pos = first_new[:, None] + torch.arange(self.max_query, device=device)[None, :]
        self.mask = (key_pos[None, None, :] <= query_pos[:, :, None])[:, None, :, :]


def _layout(meta: AttentionMetadata) -> _BatchLayout:
    layout = meta.__dict__.get(_LAYOUT_KEY)
    if layout is None:
        layout = meta.__dict__[_LAYOUT_KEY] = _BatchLayout(meta)
    return layout


def paged_attention(q: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata, scale: float,
                    num_kv_heads: int) -> torch.Tensor:
    """``q [T, num_heads, head_dim]`` (K/V already written) -> ``out [T, num_heads, head_dim]``."""
    layout = _layout(meta)
    num_seqs = meta.num_seqs
    head_dim = q.shape[-1]
    k = kv_cache[0].index_select(0, layout.blocks).view(num_seqs, -1, num_kv_heads, head_dim).transpose(1, 2)
    v = kv_cache[1].index_select(0, layout.blocks).view(num_seqs, -1, num_kv_heads, head_dim).transpose(1, 2)
    k, v = k.to(q.dtype), v.to(q.dtype)
    if layout.decode_only:
        # The query heads sharing a KV head attend as that head's queries (no K/V repeat for GQA).
        queries = q.reshape(num_seqs, num_kv_heads, -1, head_dim)  # [B, Hkv, H/Hkv, D]
        out = F.scaled_dot_product_attention(queries, k, v, attn_mask=layout.mask, scale=scale)
        return out.reshape(num_seqs, q.shape[1], head_dim)
    padded = q.new_zeros(num_seqs * layout.max_query, q.shape[1], head_dim)
    padded.index_copy_(0, layout.padded_rows, q)
    queries = padded.view(num_seqs, layout.max_query, -1, head_dim).transpose(1, 2)  # [B, H, Qmax, D]
    out = F.scaled_dot_product_attention(queries, k, v, attn_mask=layout.mask, scale=scale,
                                         enable_gqa=num_kv_heads != q.shape[1])
    out = out.transpose(1, 2).reshape(num_seqs * layout.max_query, q.shape[1], head_dim)  # [B * Qmax, H, D]
    return out.index_select(0, layout.padded_rows)
