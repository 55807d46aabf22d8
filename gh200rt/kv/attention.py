"""Plain-torch attention over the paged KV pool (the reference the Triton kernel must match).

``kv_cache``: ``[2, num_blocks, block_size, num_kv_heads, head_dim]``. A sequence's new tokens are the
last ``query_len`` of its ``seq_len`` positions, so query i of sequence b sits at position
``seq_len - query_len + i`` and sees every cached key at or before it (causal within the new
tokens, full over the cached prefix). The decodes of a step are one batched SDPA call and its
multi-token sequences another: contexts are gathered through the block tables, padded to the longest
and masked only where the lengths call for it (``_Group``). The native CPU kernels replace either group's
gather and SDPA with one call that reads the pool in place (``decode_kernel``, ``extend_kernel``). An fp8
pool is quantized on write and dequantized after the gather with the layer's ``kv_scale`` ``[K scale, V
scale]`` (kv/fp8.py); the kernels take ``kv_scale`` and dequantize each element as they read it.
"""
from __future__ import annotations

import itertools
from typing import Callable

import torch
import torch.nn.functional as F

from gh200rt.kv import fp8
from gh200rt.kv.host_blocks import HostBlocksView, host_view
from gh200rt.models.base import AttentionMetadata

_LAYOUT_KEY = "_torch_paged_attention_layout"

# (q [B, heads, D], kv_cache, block_tables [B, W], seq_lens [B], scale, kv_scale, host) -> out [B, heads, D];
# host: the layer's HostBlocksView (or None), whose blocks the tables may name, read in place
DecodeKernel = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, float, torch.Tensor | None,
                         HostBlocksView | None], torch.Tensor]
# (q [T, heads, D], kv_cache, block_tables [B, W], seq_lens [B], query_starts [B + 1], scale, kv_scale, host) -> out
# [T, heads, D], or None where the kernel leaves the group to SDPA
ExtendKernel = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, float,
                         torch.Tensor | None, HostBlocksView | None], torch.Tensor | None]


def write_kv(kv_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor,
             kv_scale: torch.Tensor | None = None) -> None:
    """Store new K/V ``[T, num_kv_heads, head_dim]`` at their flat pool slots (block * block_size + offset;
    an fp8 pool: divided by ``kv_scale``). The pool may be a strided view (the device arena lays blocks
    out block-major across layers). On the CPU a negative slot is a padding row of a bucketed decode step: it
    writes nothing (as in the Triton store, which CUDA graphs require)."""
    num_kv_heads, head_dim = kv_cache.shape[-2], kv_cache.shape[-1]
    if slot_mapping.device.type == "cpu":   # on a GPU padding rows only reach the Triton store (no sync here)
        keep = slot_mapping >= 0
        if not bool(keep.all()):
            k, v, slot_mapping = k[keep], v[keep], slot_mapping[keep]
    if fp8.is_fp8(kv_cache.dtype):
        assert kv_scale is not None, "an fp8 pool is written with its layer's kv_scale"
        k, v = fp8.quantize(k, kv_scale[0], kv_cache.dtype), fp8.quantize(v, kv_scale[1], kv_cache.dtype)
        # indexed writes have no fp8 kernel on the CPU: an fp8 pool is written through its bytes
        kv_cache, k, v = kv_cache.view(torch.uint8), k.view(torch.uint8), v.view(torch.uint8)
    k, v = k.to(kv_cache.dtype), v.to(kv_cache.dtype)
    if kv_cache[0].is_contiguous():
        kv_cache[0].view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, k)
        kv_cache[1].view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, v)
        return
    block_size = kv_cache.shape[2]
    where = (slot_mapping // block_size, slot_mapping % block_size)
    kv_cache[0].index_put_(where, k)
    kv_cache[1].index_put_(where, v)


class _Group:
    """Index tensors for the sequences of one kind in a step (all decoding, or all with several new tokens).

    SDPA gets the cheapest exact form of the group's mask: ``is_causal`` for prompts with no cached
    prefix (a padded key or query row is seen only by padded query rows, which are dropped), else an
    additive float mask built once per step and dtype (SDPA converts a boolean one in every layer).
    K/V stay padded to whole blocks: SDPA's sums depend on that width, not on the mask's form, so every
    form gives the bits of the fully masked call (tests/model/test_torch_attention_masks.py)."""

    def __init__(self, meta: AttentionMetadata, seqs: list[int], decode: bool):
        device = meta.slot_mapping.device
        query_lens = [meta.query_lens_list[b] for b in seqs]
        seq_lens = [meta.seq_lens_list[b] for b in seqs]
        self.num_seqs, self.decode = len(seqs), decode
        blocks = -(-max(seq_lens) // meta.block_size)
        whole = len(seqs) == meta.num_seqs
        table = meta.block_tables if whole else \
            meta.block_tables.index_select(0, torch.tensor(seqs, dtype=torch.long, device=device))
        self.table = table
        # index_select on a flat block list: several times faster on CPU than advanced indexing
        self.blocks = table[:, :blocks].reshape(-1).long()
        starts = [0]
        for q in meta.query_lens_list:
            starts.append(starts[-1] + q)
        # the step's flat token rows that belong to this group, in group order
        self.token_rows = None if len(seqs) == meta.num_seqs else \
            torch.tensor([starts[b] + i for b in seqs for i in range(meta.query_lens_list[b])],
                         dtype=torch.long, device=device)
        self.max_query = max(query_lens)
        self.causal = not decode and query_lens == seq_lens
        # first row of each sequence in the group's own rows, and the end (for an extend kernel)
        self.query_starts = None if decode else \
            torch.tensor([0, *itertools.accumulate(query_lens)], dtype=torch.long, device=device)
        # row of each new token in the padded [num_seqs * max_query] query layout (None: nothing padded)
        self.padded_rows = None
        if len(set(query_lens)) > 1:
            rows = [b * self.max_query + i for b, q in enumerate(query_lens) for i in range(q)]
            self.padded_rows = torch.tensor(rows, dtype=torch.long, device=device)
        self._allowed, self._masks = None, {}
        # Lengths from the device tensor when the group is the whole step: a bucketed decode step's host lists
        # hold its capacity (fixed per graph), its device seq_lens the real lengths.
        self.seq_lens = lens = meta.seq_lens if whole else torch.tensor(seq_lens, dtype=torch.long, device=device)
        if self.causal:
            return
        key_pos = torch.arange(blocks * meta.block_size, device=device)
        first_new = lens - 1 if decode else lens - torch.tensor(query_lens, dtype=torch.long, device=device)
        query_pos = first_new[:, None] + torch.arange(self.max_query, device=device)[None, :]
        self._allowed = (key_pos[None, None, :] <= query_pos[:, :, None])[:, None, :, :]  # [B, 1, Qmax, S]

    def mask(self, dtype: torch.dtype) -> torch.Tensor | None:
        """Additive mask (0 or -inf) in the query dtype; None for a causal group."""
        if self._allowed is None:
            return None
        mask = self._masks.get(dtype)
        if mask is None:
            mask = self._masks[dtype] = torch.zeros(self._allowed.shape, dtype=dtype, device=self._allowed.device
                                                    ).masked_fill_(~self._allowed, float("-inf"))
        return mask


class _BatchLayout:
    """The step's sequences split into a decode group and a multi-token group (built once per
    AttentionMetadata, shared by every layer). A mixed step (decodes next to a prefill chunk) runs
    each group on its own, so decode rows are never padded to the prefill chunk's length. With
    ``long_context``, multi-token sequences of more keys than that form a third group: an extend kernel that
    leaves long contexts to SDPA then does so per sequence, so a short prompt's bits never depend on a long one
    sharing its step."""

    def __init__(self, meta: AttentionMetadata, long_context: int | None = None):
        lens = meta.seq_lens_list
        decode = [b for b, q in enumerate(meta.query_lens_list) if q == 1]
        multi = [b for b, q in enumerate(meta.query_lens_list) if q > 1 and (long_context is None
                                                                              or lens[b] <= long_context)]
        long = [b for b, q in enumerate(meta.query_lens_list) if q > 1 and long_context is not None
                and lens[b] > long_context]
        self.groups = [_Group(meta, seqs, kind) for seqs, kind in ((decode, True), (multi, False), (long, False))
                       if seqs]
        self.single = len(self.groups) == 1


def gather_blocks(kv_cache: torch.Tensor, which: int, blocks: torch.Tensor, kv_scale: torch.Tensor | None,
                  dtype: torch.dtype, host: HostBlocksView | None = None) -> torch.Tensor:
    """Plane ``which`` of the pool's ``blocks`` (a group's ``blocks``; ids from ``host.first_id`` on: the host
    pool's), in ``dtype`` (an fp8 pool dequantized)."""
    return _gather(kv_cache, which, blocks, kv_scale, dtype, host)


def attend_group(q: torch.Tensor, kv_cache: torch.Tensor, group: _Group, scale: float, num_kv_heads: int,
                 kv_scale: torch.Tensor | None = None, host: HostBlocksView | None = None) -> torch.Tensor:
    """The gather-and-SDPA attention of one ``batch_layout`` group; ``q`` holds exactly its token rows."""
    return _attend(q, kv_cache, group, scale, num_kv_heads, kv_scale, None, host=host)


def batch_layout(meta: AttentionMetadata) -> _BatchLayout:
    """The step's decode / multi-token groups (built once per metadata, shared by every layer)."""
    return _layout(meta)


def _layout(meta: AttentionMetadata, long_context: int | None = None) -> _BatchLayout:
    layout = meta.__dict__.get(_LAYOUT_KEY)
    if layout is None:
        layout = meta.__dict__[_LAYOUT_KEY] = _BatchLayout(meta, long_context)
    return layout


def paged_attention(q: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata, scale: float,
                    num_kv_heads: int, kv_scale: torch.Tensor | None = None,
                    decode_kernel: DecodeKernel | None = None,
                    extend_kernel: ExtendKernel | None = None, long_context: int | None = None,
                    host: HostBlocksView | None = None) -> torch.Tensor:
    """``q [T, num_heads, head_dim]`` (K/V already written) -> ``out [T, num_heads, head_dim]``.

    ``decode_kernel(q, kv_cache, block_tables, seq_lens, scale)`` and ``extend_kernel(q, kv_cache, block_tables,
    seq_lens, query_starts, scale)``, when given, attend the step's decode group and its multi-token groups in
    place of the gather and SDPA (native CPU kernels that read the pool in place); ``long_context``: the keys past
    which multi-token sequences form a group of their own (the extend kernel's limit). ``host``: the layer's host
    KV blocks, which table entries from ``host.first_id`` on name (kv/host_blocks.py): the kernels read them in
    place, the gather takes them from both pools."""
    host = host if host is not None else host_view(meta, kv_cache)
    layout = _layout(meta, long_context)
    if layout.single:
        return _attend(q, kv_cache, layout.groups[0], scale, num_kv_heads, kv_scale, decode_kernel, extend_kernel,
                       host)
    out = torch.empty_like(q)
    for group in layout.groups:
        out.index_copy_(0, group.token_rows, _attend(q.index_select(0, group.token_rows), kv_cache, group, scale,
                                                     num_kv_heads, kv_scale, decode_kernel, extend_kernel, host))
    return out


def _stored_blocks(pool: torch.Tensor, which: int, blocks: torch.Tensor) -> torch.Tensor:
    if not fp8.is_fp8(pool.dtype):
        return pool[which].index_select(0, blocks)
    return pool[which].view(torch.uint8).index_select(0, blocks).view(pool.dtype)  # bytes: any device


def _stored_blocks_of_both(kv_cache: torch.Tensor, which: int, blocks: torch.Tensor,
                           host: HostBlocksView) -> torch.Tensor:
    """Each of ``blocks`` read from the pool its id names: one gather from each pool, so each block's bytes cross
    the link once (a host view on a GPU is read in place)."""
    on_host = blocks >= host.first_id
    host_rows = on_host.nonzero().squeeze(1)
    if host_rows.numel() == 0:
        return _stored_blocks(kv_cache, which, blocks)
    device_rows = (~on_host).nonzero().squeeze(1)
    out = torch.empty((blocks.numel(), *kv_cache.shape[2:]), dtype=kv_cache.dtype, device=kv_cache.device)
    as_bytes = (lambda t: t.view(torch.uint8)) if fp8.is_fp8(kv_cache.dtype) else (lambda t: t)  # noqa: E731
    as_bytes(out).index_copy_(0, device_rows, as_bytes(_stored_blocks(kv_cache, which, blocks[device_rows])))
    as_bytes(out).index_copy_(0, host_rows, as_bytes(_stored_blocks(host.pool, which,
                                                                   blocks[host_rows] - host.first_id)))
    return out


def _gather(kv_cache: torch.Tensor, which: int, blocks: torch.Tensor, kv_scale: torch.Tensor | None,
            dtype: torch.dtype, host: HostBlocksView | None = None) -> torch.Tensor:
    stored = _stored_blocks(kv_cache, which, blocks) if host is None else \
        _stored_blocks_of_both(kv_cache, which, blocks, host)
    if not fp8.is_fp8(kv_cache.dtype):
        return stored.to(dtype)
    return fp8.dequantize(stored, kv_scale[which], dtype)


def _attend(q: torch.Tensor, kv_cache: torch.Tensor, group: _Group, scale: float, num_kv_heads: int,
            kv_scale: torch.Tensor | None, decode_kernel: DecodeKernel | None,
            extend_kernel: ExtendKernel | None = None, host: HostBlocksView | None = None) -> torch.Tensor:
    """Attention for one group; ``q`` holds exactly the group's token rows, in group order."""
    if group.decode and decode_kernel is not None:
        return decode_kernel(q, kv_cache, group.table, group.seq_lens, scale, kv_scale, host)
    if not group.decode and extend_kernel is not None:
        out = extend_kernel(q, kv_cache, group.table, group.seq_lens, group.query_starts, scale, kv_scale, host)
        if out is not None:
            return out
    num_seqs, head_dim = group.num_seqs, q.shape[-1]
    k = _gather(kv_cache, 0, group.blocks, kv_scale, q.dtype, host).view(num_seqs, -1, num_kv_heads,
                                                                         head_dim).transpose(1, 2)
    v = _gather(kv_cache, 1, group.blocks, kv_scale, q.dtype, host).view(num_seqs, -1, num_kv_heads,
                                                                         head_dim).transpose(1, 2)
    if group.decode:
        # The query heads sharing a KV head attend as that head's queries (no K/V repeat for GQA).
        queries = q.reshape(num_seqs, num_kv_heads, -1, head_dim)  # [B, Hkv, H/Hkv, D]
        out = F.scaled_dot_product_attention(queries, k, v, attn_mask=group.mask(q.dtype), scale=scale)
        return out.reshape(num_seqs, q.shape[1], head_dim)
    if group.padded_rows is not None:
        padded = q.new_zeros(num_seqs * group.max_query, q.shape[1], head_dim)
        q = padded.index_copy_(0, group.padded_rows, q)
    queries = q.reshape(num_seqs, group.max_query, -1, head_dim).transpose(1, 2)  # [B, H, Qmax, D]
    out = F.scaled_dot_product_attention(queries, k, v, attn_mask=group.mask(q.dtype), is_causal=group.causal,
                                         scale=scale, enable_gqa=num_kv_heads != q.shape[1])
    out = out.transpose(1, 2).reshape(num_seqs * group.max_query, q.shape[1], head_dim)  # [B * Qmax, H, D]
    return out if group.padded_rows is None else out.index_select(0, group.padded_rows)
