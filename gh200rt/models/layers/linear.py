"""A linear layer whose weight lives behind a WeightRef (resident tensor, staging slot, host view or packed)."""
from __future__ import annotations

import torch
from torch import nn

from gh200rt.kernels.quant import HalfWeight, PackedWeight
from gh200rt.models.base import WeightRef
from gh200rt.models.layers.cpu_linear import dense_linear
from gh200rt.models.layers.row_blocks import in_row_blocks


class RefLinear(nn.Module):
    """``y = x W^T (+ b)``; W is read from ``weight_ref.current`` on every call, never cached.

    A dense weight goes through ``dense_fn`` (``dense_linear``: oneDNN for float32 on the CPU, else F.linear;
    the native CPU kernels swap in ``native_dense_linear``); a packed or fp16 one computes through its own
    ``linear`` (on the CPU through the native quantized linear, or the native fp16 one for a few rows, unless
    ``packed_native`` is off: ``--cpu-kernels torch``), or through ``dense_fn`` over the dense weight it hands
    back from ``dense_for`` (fp8 on the CPU). ``block_rows`` (the step's ``AttentionMetadata.linear_rows``)
    computes the rows in calls of exactly that many (``row_blocks.py``), so a row's bits do not depend on the
    others in the step. ``lora`` (a ``gh200rt.lora.slots.LoraLinear``, set by ``install_lora``) adds the step's
    per-token adapter deltas to the output.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool, dtype: torch.dtype,
                 device: torch.device | str = "cpu", weight: torch.Tensor | None = None):
        """``weight``: the ``[out, in]`` tensor to start from (e.g. one expert's slice of a stacked tensor);
        by default a new uninitialised one."""
        super().__init__()
        if weight is None:
            weight = torch.empty(out_features, in_features, dtype=dtype, device=device)
        assert tuple(weight.shape) == (out_features, in_features) and weight.dtype == dtype, (weight.shape, dtype)
        self.weight_ref = WeightRef(weight, (out_features, in_features), dtype)
        self.bias = nn.Parameter(torch.empty(out_features, dtype=dtype, device=device),
                                 requires_grad=False) if bias else None
        self.dense_fn = dense_linear
        self.packed_native = True
        self.lora = None

    def forward(self, x: torch.Tensor, block_rows: int | None = None) -> torch.Tensor:
        y = self._base(x, block_rows)
        return y if self.lora is None else self.lora.add_to(y, x, block_rows)

    def _base(self, x: torch.Tensor, block_rows: int | None) -> torch.Tensor:
        weight = self.weight_ref.current
        if block_rows is None:
            return self._linear(weight, x)
        if isinstance(weight, PackedWeight):   # dequantized once per call, not once per block
            weight = weight.block_form(x, block_rows, native=self.packed_native)
        return in_row_blocks(lambda rows: self._linear(weight, rows), x, block_rows)

    def _linear(self, weight, x: torch.Tensor) -> torch.Tensor:
        if isinstance(weight, torch.Tensor):
            return self.dense_fn(x, weight, self.bias)
        if isinstance(weight, HalfWeight):
            return weight.linear(x, self.bias, native=self.packed_native)
        if not isinstance(weight, PackedWeight):
            return weight.linear(x, self.bias)
        dense = weight.dense_for(x)
        if dense is not None:
            return self.dense_fn(x, dense, self.bias)
        return weight.linear(x, self.bias, native=self.packed_native)
