"""Latent attention's prompt chunks in the expanded form, for a GPU (``LatentAttention.prefill_fn``).

The absorbed form (``mla.py``) attends every query head to 576-wide latent rows (V3): per key and head it costs
(r + rope) multiply-adds for the score and r for the value, where the expanded form costs nope + rope (192) and v
(128), and the torch attention it falls back to for chunks longer than the latent kernel takes builds a
``[sequences, heads, queries, keys]`` score tensor (128 heads x 2048 queries x 32k keys: 34 GB in float32). A chunk
of many new tokens therefore computes its heads' keys and values once per key instead: the sequence's latent rows
gathered from the pool, ``kv_b_proj`` over them, the rotary key shared by every head, and one SDPA over per-head
192-wide queries and keys (values padded to that width on a GPU, as the flash kernels want one head width), whose
memory grows with queries x keys, not with heads. The decoding sequences of the same step keep the absorbed form
(expanding a whole context for one query would cost more than it saves). vLLM splits its MLA steps the same way.

The two forms agree to float32 rounding (a CPU test holds them within it); they are different sums, so a GPU makes
no bit-for-bit promise between a prompt's chunks and its decodes, as for every other model there.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from gh200rt.kv.attention import attend_group, batch_layout, gather_blocks
from gh200rt.kv.host_blocks import HostBlocksView, host_view
from gh200rt.models.base import AttentionMetadata


def expanded_prefill(attn, q_nope: torch.Tensor, q_pe: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata,
                     min_query: int, pad_values: bool = True) -> torch.Tensor | None:
    """The step's values ``[T, H, v_head_dim]`` (``attn``: the ``LatentAttention``; its rows already in the one-plane
    pool ``kv_cache``) with every multi-token sequence in the expanded form and the decodes absorbed; None (the
    absorbed form for the whole step) where no sequence has more than ``min_query`` new tokens. ``pad_values``:
    values padded to the query width for SDPA (a GPU's flash kernels take one head width)."""
    if max(meta.query_lens_list) <= min_query:
        return None
    tokens = q_nope.shape[0]
    values = q_nope.new_empty(tokens, attn.num_heads, attn.v_dim)
    host = host_view(meta, kv_cache)          # host KV blocks the tables may name (read in place)
    for group in batch_layout(meta).groups:
        rows = group.token_rows
        nope = q_nope if rows is None else q_nope.index_select(0, rows)
        pe = q_pe if rows is None else q_pe.index_select(0, rows)
        out = _absorbed(attn, nope, pe, kv_cache, group, host) if group.decode else \
            _expanded(attn, nope, pe, kv_cache, group, pad_values, host)
        if rows is None:
            return out
        values.index_copy_(0, rows, out)
    return values


def _absorbed(attn, q_nope: torch.Tensor, q_pe: torch.Tensor, kv_cache: torch.Tensor, group,
              host: HostBlocksView | None) -> torch.Tensor:
    w_uk, w_uv_t = attn.absorbed_weights()
    query = torch.cat((torch.bmm(q_nope.transpose(0, 1), w_uk).transpose(0, 1), q_pe), dim=-1)
    as_planes = (lambda t: t.expand(2, *t.shape[1:]))   # noqa: E731  (the row is K and V)
    out = attend_group(query, as_planes(kv_cache), group, attn.scale, 1, attn.kv_scale,
                       None if host is None else HostBlocksView(as_planes(host.pool), host.first_id))
    return torch.bmm(out[..., :attn.rank].transpose(0, 1), w_uv_t).transpose(0, 1)


def _expanded(attn, q_nope: torch.Tensor, q_pe: torch.Tensor, kv_cache: torch.Tensor, group,
              pad_values: bool, host: HostBlocksView | None) -> torch.Tensor:
    heads, nope, v_dim, rank = attn.num_heads, attn.nope_dim, attn.v_dim, attn.rank
    latent = gather_blocks(kv_cache, 0, group.blocks, attn.kv_scale, q_nope.dtype, host)
    latent = latent.reshape(group.num_seqs, -1, latent.shape[-1])                     # [B, S, r + rope]
    keys = latent.shape[1]
    kv = attn.kv_b_proj(latent[..., :rank].reshape(-1, rank)).view(group.num_seqs, keys, heads, nope + v_dim)
    k = torch.cat((kv[..., :nope], latent[:, :, None, rank:].expand(-1, -1, heads, -1)), dim=-1)
    v = kv[..., nope:]
    width = k.shape[-1]
    if pad_values and v_dim < width:
        v = F.pad(v, (0, width - v_dim))
    q = torch.cat((q_nope, q_pe), dim=-1)
    if group.padded_rows is not None:
        q = q.new_zeros(group.num_seqs * group.max_query, heads, width).index_copy_(0, group.padded_rows, q)
    queries = q.view(group.num_seqs, group.max_query, heads, width).transpose(1, 2)   # [B, H, Qmax, D]
    out = F.scaled_dot_product_attention(queries, k.transpose(1, 2), v.transpose(1, 2),
                                         attn_mask=group.mask(q.dtype), is_causal=group.causal, scale=attn.scale)
    out = out[..., :v_dim].transpose(1, 2).reshape(group.num_seqs * group.max_query, heads, v_dim)
    return out if group.padded_rows is None else out.index_select(0, group.padded_rows)
