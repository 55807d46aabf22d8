"""The ``--max-loras`` device slots: per decoder layer and fused linear, stacks ``A [S, R, in]`` and
``B [S, out, R]`` with ``R = parts x --max-lora-rank``, allocated once (booked in the ledger as ``lora_slots``
before the KV cache takes what is left) and never reallocated.

A fused linear's parts stack block-diagonally: part p's ``A`` fills rows ``[p R', p R' + r)`` of the slot's A
(R' = max rank) and its ``B`` the matching columns of its own output rows of B; so q, k and v (gate and up) each
read only their own rank block, and one shrink and one expand compute all parts. Zero padding adds nothing.
``LoraLinear`` is what a ``RefLinear`` calls (its ``lora``) to add the step's deltas to its output.
"""
from __future__ import annotations

import torch

from gh200rt.lora.grouped import lora_add_grouped
from gh200rt.lora.peft_adapter import LoraAdapter, target_shapes
from gh200rt.lora.step import LoraBatch
from gh200rt.models.layers.mla import ABSORBED_WEIGHTS


def slot_targets(arch) -> dict[tuple[int, str], tuple[int, tuple[int, ...]]]:
    return {(layer, target): shape for layer in range(arch.num_layers)
            for target, shape in target_shapes(arch, layer).items()}


def slot_bytes(arch, num_slots: int, max_rank: int, dtype: torch.dtype) -> int:
    """Device bytes of all slots (what the ledger books as ``lora_slots``)."""
    item = torch.empty(0, dtype=dtype).element_size()
    per_slot = sum(len(outs) * max_rank * (fan_in + sum(outs)) for fan_in, outs in slot_targets(arch).values())
    return num_slots * per_slot * item


class LoraLinear:
    """One linear's slot stacks and the batch it reads the step from."""

    def __init__(self, a: torch.Tensor, b: torch.Tensor, batch: LoraBatch):
        self.a, self.b, self.batch = a, b, batch

    def add_to(self, y: torch.Tensor, x: torch.Tensor, block_rows: int | None = None) -> torch.Tensor:
        """``y`` (the base output of ``x``) plus each token's adapter delta; ``y`` itself when the step has none.
        ``block_rows``: the base linear's row blocks (``--batch-invariant``, the CPU only), kept by the delta too."""
        step = self.batch.step
        if step is None or step.is_empty:
            return y
        if self.batch.use_triton:
            assert block_rows is None, "batch-invariant steps run on the CPU (torch path) only"
            from gh200rt.kernels.triton.lora_sgmv import lora_add_triton
            return lora_add_triton(x.contiguous(), y.contiguous(), self.a, self.b, self.batch.scales_device, step.segs,
                                   step.max_len)
        return lora_add_grouped(x, y, self.a, self.b, self.batch.scales, step.groups, block_rows)


class LoraSlots:
    """Allocates the slots of ``model`` and hangs a ``LoraLinear`` on each target ``RefLinear``."""

    def __init__(self, model, arch, num_slots: int, max_rank: int, dtype: torch.dtype, device, batch: LoraBatch):
        self.max_rank = max_rank
        self.batch = batch
        self.linears: dict[tuple[int, str], LoraLinear] = {}
        self._outs = {key: outs for key, (_, outs) in slot_targets(arch).items()}
        for (layer, target), (fan_in, outs) in slot_targets(arch).items():
            rank = len(outs) * max_rank
            a = torch.zeros(num_slots, rank, fan_in, dtype=dtype, device=device)
            b = torch.zeros(num_slots, sum(outs), rank, dtype=dtype, device=device)
            lora = LoraLinear(a, b, batch)
            self.linears[(layer, target)] = lora
            block, name = target.split(".")
            module = getattr(model.layers[layer], block)
            if target in ABSORBED_WEIGHTS:    # latent attention adds its delta through the absorption products
                module.kv_b_lora = lora
            else:
                getattr(module, name).lora = lora
        self.nbytes = sum(lin.a.nbytes + lin.b.nbytes for lin in self.linears.values())

    @torch.inference_mode()
    def load(self, slot: int, adapter: LoraAdapter) -> None:
        """Copy ``adapter`` into ``slot`` (between steps; a step launched ahead that still reads the slot on a GPU
        was issued before these copies on the same stream, so it reads the old adapter)."""
        r, big_r = adapter.rank, self.max_rank
        for key, lora in self.linears.items():
            lora.a[slot].zero_()
            lora.b[slot].zero_()
            parts = adapter.weights.get(key, ())
            row = 0
            for p, out in enumerate(self._outs[key]):
                pair = parts[p] if p < len(parts) else None
                if pair is not None:
                    lora.a[slot, p * big_r:p * big_r + r].copy_(pair[0], non_blocking=True)
                    lora.b[slot, row:row + out, p * big_r:p * big_r + r].copy_(pair[1], non_blocking=True)
                row += out
        self.batch.set_scale(slot, adapter.scale)
