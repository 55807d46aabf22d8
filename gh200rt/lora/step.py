"""A step's LoRA inputs: which device slot each token's adapter sits in, as segments and per-slot groups.

The model runner builds one ``LoraStep`` per step from the scheduled sequences (each sequence's tokens are
consecutive in the flattened batch) and sets it on the ``LoraBatch`` every LoRA linear was given at install; it
clears it after the step. A linear reads ``batch.step`` when called: the step's data travel with the step, not
through a module-level global, and a model run without a step (``step`` None) adds nothing.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

NO_SLOT = -1


@dataclass
class LoraStep:
    segments: list[tuple[int, int, int]]          # (slot, start, end): runs of consecutive tokens of one slot
    groups: list[tuple[int, slice | torch.Tensor]]  # slot -> its rows (the torch path; empty for Triton)
    segs: torch.Tensor | None                     # int32 [S, 3] on the device (the Triton path)
    max_len: int

    @property
    def is_empty(self) -> bool:
        return not self.segments


def lora_step(slot_runs: list[tuple[int, int]], device: torch.device | str, for_triton: bool) -> LoraStep:
    """``slot_runs``: (slot, tokens) per scheduled sequence in batch order; slot ``NO_SLOT`` for the base model."""
    segments: list[tuple[int, int, int]] = []
    start = 0
    for slot, count in slot_runs:
        if slot != NO_SLOT:
            if segments and segments[-1][0] == slot and segments[-1][2] == start:
                segments[-1] = (slot, segments[-1][1], start + count)
            else:
                segments.append((slot, start, start + count))
        start += count
    by_slot: dict[int, list[tuple[int, int]]] = {}
    for slot, a, b in segments:
        by_slot.setdefault(slot, []).append((a, b))
    groups: list[tuple[int, slice | torch.Tensor]] = []
    for slot, runs in ({} if for_triton else by_slot).items():
        if len(runs) == 1:
            groups.append((slot, slice(*runs[0])))
        else:
            rows = [t for a, b in runs for t in range(a, b)]
            groups.append((slot, torch.tensor(rows, dtype=torch.int64).to(device, non_blocking=True)))
    segs = None
    if for_triton and segments:        # (slot, start, length) rows, what the Triton kernels read
        flat = [v for slot, a, b in segments for v in (slot, a, b - a)]
        segs = torch.tensor(flat, dtype=torch.int32).view(-1, 3).to(device, non_blocking=True)
    return LoraStep(segments, groups, segs, max((b - a for _, a, b in segments), default=0))


class LoraBatch:
    """What the LoRA linears of one model share: the current step's ``LoraStep`` and each slot's scale."""

    def __init__(self, num_slots: int, device: torch.device | str, use_triton: bool):
        self.step: LoraStep | None = None
        self.scales = [0.0] * num_slots                # host copies: the torch path reads them without a sync
        self.scales_device = torch.zeros(num_slots, dtype=torch.float32, device=device)
        self.use_triton = use_triton
        self.device = device

    def set_scale(self, slot: int, scale: float) -> None:
        self.scales[slot] = scale
        self.scales_device[slot] = scale
