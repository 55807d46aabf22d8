"""What the fused MoE kernels (kernels/triton/fused_moe.py) read besides the activations: the step's (token, choice)
pairs sorted and aligned into expert blocks, and each projection's experts as a table of addresses.

``moe_align`` (torch, no host sync) sorts the step's ``T*k`` (token, choice) pairs by expert id (stably: token
order within an expert) and pads each expert's run to a multiple of ``BLOCK_M``, as vLLM's
``moe_align_block_size`` does; every tensor it returns has a size fixed by ``T``, ``k``, ``E`` and ``BLOCK_M``,
so a CUDA graph can capture it. A block of ``BLOCK_M`` rows belongs to one expert; blocks past the last run are
marked with expert ``E`` and return at once, and an expert without tokens owns no block, so only the experts
the step routes to are read (DESIGN.md, "Mixture of experts").

Weights are addressed through a device table of per-expert addresses (``ExpertStack``: weight, scale,
minimum for each expert) rather than one base pointer and an expert stride: an expert's weight may be a
resident device copy, a direct view of the host slab (the same address on the device, ATS or registered
memory) or any mix of the two in one layer, and one launch reads them all. The table is rebuilt only when
a WeightRef changes (the caller keys it on the refs' versions). ``expert_stack`` builds it, or says why the
kernels cannot read the experts (mismatched layouts, a group size the K tile cuts, fp8 with group scales).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from gh200rt.kernels.triton.weight_operands import FMT_SCALED, weight_operands

BLOCK_K = 64
FP32_BLOCK_K = 32   # float32 weight tiles of 64 columns spill gate_up's two accumulators on sm_90


# ---- sort and align ---------------------------------------------------------------------------------------
def moe_align(ids: torch.Tensor, num_experts: int, block_m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(``sorted_pairs`` int64 [P], ``block_expert`` int64 [P / block_m]) for ``ids`` [T, k].

    ``sorted_pairs``: flat pair indices (``t * k + j``) grouped by expert, each expert's run padded to a
    multiple of ``block_m`` with ``T*k`` (no pair); ``block_expert[b]``: the expert of rows
    ``[b*block_m, (b+1)*block_m)``, ``num_experts`` for blocks past the last run. ``P`` is the most padding
    could need (``T*k + min(E, T*k) * (block_m - 1)``, rounded up to a block), so nothing is read back."""
    flat = ids.reshape(-1)
    pairs = flat.numel()
    order = torch.argsort(flat, stable=True)
    counts = torch.zeros(num_experts, dtype=torch.int64, device=ids.device)
    counts.scatter_add_(0, flat, torch.ones_like(flat))      # bincount reads its size back on CUDA
    padded = (counts + block_m - 1) // block_m * block_m
    padded_ends = torch.cumsum(padded, 0)
    sorted_expert = flat[order]
    rank = torch.arange(pairs, device=ids.device) - (torch.cumsum(counts, 0) - counts)[sorted_expert]
    total = pairs + min(num_experts, pairs) * (block_m - 1)
    total = -(-total // block_m) * block_m
    sorted_pairs = torch.full((total,), pairs, dtype=torch.int64, device=ids.device)
    sorted_pairs[padded_ends[sorted_expert] - padded[sorted_expert] + rank] = order
    block_starts = torch.arange(0, total, block_m, device=ids.device)
    block_expert = torch.searchsorted(padded_ends, block_starts, right=True)
    return sorted_pairs, block_expert


# ---- the experts' weights as the kernels address them ------------------------------------------------------
@dataclass(frozen=True)
class ExpertStack:
    """One projection of a layer's E experts (each ``[N, K]``): a device table of addresses and the layout
    every expert shares. ``like``: one expert's weight tensor, whose dtype types the kernel's loads."""
    table: torch.Tensor     # int64 [3, E]: weight, scale and minimum address per expert
    like: torch.Tensor
    fmt: int
    shape: tuple[int, int]
    group_size: int
    row_stride: int         # elements (bytes for int4) from one weight row to the next
    scale_stride: int
    group_tile: int         # groups a BLOCK_K tile spans (1: the whole tile is in one group)
    scale_on_acc: bool      # one scale per output channel, applied to the accumulator
    block_k: int


def group_tile(group_size: int, k: int, block_k: int = BLOCK_K) -> int | None:
    """Groups in one K tile, or None when a tile would cover part of a group and part of the next."""
    if group_size >= k or group_size % block_k == 0:
        return 1
    if block_k % group_size == 0:
        return block_k // group_size
    return None


def expert_stack(weights: list, device: torch.device) -> ExpertStack | str:
    """The stack of ``weights`` (one per expert: a tensor, ``PackedWeight`` or ``HalfWeight``), or why the
    kernels cannot read them (then the caller keeps the grouped torch path)."""
    operands = [weight_operands(w) for w in weights]
    fmt, w0, scale0, _, group = operands[0]
    shape = tuple(weights[0].shape)
    layout = (fmt, w0.dtype, w0.shape, w0.stride(), scale0.stride(), scale0.shape, group)
    for e, (f, w, scale, _, g) in enumerate(operands):
        if (f, w.dtype, w.shape, w.stride(), scale.stride(), scale.shape, g) != layout:
            return f"expert {e}'s weight is laid out unlike expert 0's ({f}, {w.dtype}, {tuple(w.shape)}, group {g})"
        if w.stride(-1) != 1 or scale.stride(-1) != 1:
            return f"expert {e}'s weight rows are not contiguous"
        if w.device.type != device.type and not (device.type == "cuda" and w.is_pinned()):
            return f"expert {e}'s weight is on {w.device}, not readable by the kernels on {device}"
    block_k = FP32_BLOCK_K if w0.dtype == torch.float32 else BLOCK_K
    tile = group_tile(group, shape[1], block_k)
    if tile is None:
        return f"group size {group} neither divides nor is a multiple of the kernels' K tile {BLOCK_K}"
    scale_on_acc = fmt == FMT_SCALED and group >= shape[1]
    if fmt == FMT_SCALED and not scale_on_acc and w0.dtype != torch.int8:
        return "fp8 weights with group scales"
    table = torch.tensor([[op[i].data_ptr() for op in operands] for i in (1, 2, 3)], dtype=torch.int64)
    return ExpertStack(table.to(device), w0, fmt, shape, group, w0.stride(0), scale0.stride(0), tile, scale_on_acc,
                       block_k)
