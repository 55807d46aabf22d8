"""LoRA on a linear that latent attention absorbs (``kv_b_proj``, models/layers/mla.py): the adapter's delta taken
through the two absorption products instead of through the linear.

``kv_b_proj`` stacks per head ``W_UK[h]`` (the keys' non-rotary part) and ``W_UV[h]`` (the values) over the latent
``c``; an adapter adds ``s B A`` to it, so head h's key part gains ``s B_K[h] A`` and its value part ``s B_V[h] A``
(``A [R, r]``, ``B`` cut per head like the weight). Absorbed, that is

* the latent query: ``q_lat[t, h] += s A^T (B_K[h]^T q_nope[t, h])``;
* the values: ``v[t, h] += s B_V[h] (A o[t, h])``, ``o`` the attention's weighted sum of latents,

both at rank R per head, so no per-adapter absorbed copy of the weight is made. Each run of tokens under one adapter
is computed on its own; with ``rows`` (``--batch-invariant``) in blocks of exactly that many rows, as the base
products are, so a row's bits do not depend on the rows beside it.
"""
from __future__ import annotations

import torch

from gh200rt.models.layers.row_blocks import in_row_blocks


def _runs(lora) -> list[tuple[int, int, int]]:
    step = lora.batch.step
    return [] if step is None else step.segments


def _each_run(lora, out: torch.Tensor, x: torch.Tensor, product, rows: int | None) -> torch.Tensor:
    """``out[t] += scale * product(slot, x[t])`` for each run of tokens of one adapter (``x [T, H, a]``, ``product``
    ``[m, H, a] -> [m, H, b]``)."""
    heads, width = x.shape[1], x.shape[2]
    for slot, start, end in _runs(lora):
        taken = x[start:end]
        if rows is None:
            delta = product(slot, taken)
        else:
            flat = taken.reshape(end - start, heads * width)
            delta = in_row_blocks(lambda block: product(slot, block.view(-1, heads, width)).flatten(1), flat, rows)
            delta = delta.view(end - start, heads, -1)
        out[start:end].add_(delta.mul_(lora.batch.scales[slot]))
    return out


def add_query_deltas(lora, q_latent: torch.Tensor, q_nope: torch.Tensor, nope_dim: int,
                     rows: int | None) -> torch.Tensor:
    """``q_latent [T, H, r]`` (``W_UK^T q_nope``) plus each token's adapter's key delta, in place."""
    heads = q_nope.shape[1]

    def product(slot: int, x: torch.Tensor) -> torch.Tensor:
        b_k = lora.b[slot].view(heads, -1, lora.b.shape[-1])[:, :nope_dim]         # [H, nope, R]
        shrunk = torch.bmm(x.transpose(0, 1), b_k)                                 # [H, m, R]
        return (shrunk @ lora.a[slot]).transpose(0, 1)                             # [m, H, r]
    return _each_run(lora, q_latent, q_nope, product, rows)


def add_value_deltas(lora, values: torch.Tensor, latent_out: torch.Tensor, nope_dim: int,
                     rows: int | None) -> torch.Tensor:
    """``values [T, H, v]`` (``W_UV o``) plus each token's adapter's value delta, in place."""
    heads = latent_out.shape[1]

    def product(slot: int, x: torch.Tensor) -> torch.Tensor:
        b_v = lora.b[slot].view(heads, -1, lora.b.shape[-1])[:, nope_dim:]         # [H, v, R]
        shrunk = (x @ lora.a[slot].T).transpose(0, 1)                              # [H, m, R]
        return torch.bmm(shrunk, b_v.transpose(1, 2)).transpose(0, 1)              # [m, H, v]
    return _each_run(lora, values, latent_out, product, rows)
