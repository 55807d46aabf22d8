"""The SiLU-gated MLP of a dense decoder layer (and of each MoE expert): fused ``[gate | up]``, then down.

Checkpoints store gate, up and down separately (``mlp.gate_proj`` / ``up_proj`` / ``down_proj``; Mixtral's
experts ``w1`` / ``w3`` / ``w2``); ``checkpoint_destinations`` hands the loader a view of the fused weight
for each, so every tensor is written once into wherever the WeightRef points now.
"""
from __future__ import annotations

import torch
from torch import nn

from gh200rt.models.base import WeightRef, dense_weight
from gh200rt.models.layers.activation import SiluAndMul
from gh200rt.models.layers.linear import RefLinear

HF_NAMES = ("gate_proj", "up_proj", "down_proj")


class GatedMLP(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int, dtype: torch.dtype, device,
                 gate_up: torch.Tensor | None = None, down: torch.Tensor | None = None):
        """``gate_up`` [2I, H] / ``down`` [H, I]: storage to start from (an expert's slice of a stack)."""
        super().__init__()
        self.gate_up_proj = RefLinear(hidden_size, 2 * intermediate_size, False, dtype, device, gate_up)
        self.down_proj = RefLinear(intermediate_size, hidden_size, False, dtype, device, down)
        self.act = SiluAndMul()

    def forward(self, x: torch.Tensor, block_rows: int | None = None) -> torch.Tensor:
        """``block_rows``: run the linears on blocks of exactly that many rows (layers/row_blocks.py)."""
        fused = self.fused_silu(x.numel() // x.shape[-1], block_rows)
        if fused is not None:
            return self.down_proj(fused.silu_linear(x), block_rows)
        return self.down_proj(self.act(self.gate_up_proj(x, block_rows)), block_rows)

    def fused_silu(self, rows: int, block_rows: int | None):
        """The gate/up weight form that computes the product and the SiLU in one call with the bits of the two
        (``AmxWeight``), where the activation is the native ``silu_mul`` and no adapter or bias adds to the product."""
        linear = self.gate_up_proj
        form = getattr(linear.weight_ref.current, "silu_form", None)
        if form is None or linear.lora is not None or linear.bias is not None \
                or not getattr(self.act.act_fn, "native_silu_mul", False):
            return None
        return form(rows, block_rows)

    def weight_refs(self) -> dict[str, WeightRef]:
        return {"gate_up_proj": self.gate_up_proj.weight_ref, "down_proj": self.down_proj.weight_ref}

    def checkpoint_destinations(self, prefix: str, names: tuple[str, str, str] = HF_NAMES) -> dict[str, torch.Tensor]:
        """Checkpoint name (``prefix`` + gate / up / down name + ``.weight``) -> the tensor it is copied into."""
        gate, up, down = names
        fused = dense_weight(self.gate_up_proj.weight_ref, prefix + "gate_up_proj")
        rows = fused.shape[0] // 2
        return {f"{prefix}{gate}.weight": fused[:rows], f"{prefix}{up}.weight": fused[rows:],
                f"{prefix}{down}.weight": dense_weight(self.down_proj.weight_ref, prefix + down)}

    @staticmethod
    def fused_names(prefix: str, names: tuple[str, str, str] = HF_NAMES) -> dict[str, str]:
        """Checkpoint name -> the fused weight it is a row block of (for the loader's error messages)."""
        gate, up, _ = names
        return {f"{prefix}{part}.weight": f"{prefix}gate_up_proj.weight" for part in (gate, up)}
