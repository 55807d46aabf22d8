"""SiLU-gated activation over a fused ``[gate | up]`` projection."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


class SiluAndMul(nn.Module):
    """``silu_and_mul`` as a module, so a model's MLP can have it swapped for the Triton kernel."""

    def __init__(self):
        super().__init__()
        # silu_and_mul may be swapped for the Triton kernel with the same signature (backends/cuda/ops.py)
        self.act_fn = silu_and_mul

    def forward(self, gate_up: torch.Tensor) -> torch.Tensor:
        return self.act_fn(gate_up)
