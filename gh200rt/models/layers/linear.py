"""A linear layer whose weight lives behind a WeightRef (resident tensor, staging slot, host view or packed)."""
from __future__ import annotations

import torch
from torch import nn

from gh200rt.formats.pack import HalfWeight, PackedWeight
from gh200rt.models.base import WeightRef
from gh200rt.models.layers.dense import dense_linear, onednn_available, onednn_linear
from gh200rt.models.layers.row_blocks import RowBlockSizes, in_row_blocks

# The block sizes each linear route was found to keep a row's bits at, for every RefLinear of the process.
ROW_BLOCK_SIZES = RowBlockSizes()


class RefLinear(nn.Module):
    """``y = x W^T (+ b)``; W is read from ``weight_ref.current`` on every call, never cached.

    A dense weight goes through ``dense_fn`` (``dense_linear``: oneDNN for float32 on the CPU, else F.linear;
    the native CPU kernels swap in ``native_dense_linear``); a packed or fp16 one computes through its own
    ``linear`` (on the CPU through the native quantized linear, or the native fp16 one for a few rows, unless
    ``packed_native`` is off: ``--cpu-kernels torch``), or through ``dense_fn`` over the dense weight it hands
    back from ``dense_for`` (fp8 on the CPU). ``block_rows`` (the step's ``AttentionMetadata.linear_rows``)
    computes the rows in calls of exactly that many, or of the larger sizes found to give the same bits
    (``row_blocks.py``), so a row's bits do not depend on the others in the step (a form whose ``invariant_form()``
    computes every row alike at any row count, ``AmxWeight``, takes the step's rows in one call); a dense float32
    weight's blocks
    go to oneDNN wherever it exists, whose calls compute every row alike (MKL's AVX2 kernels do not, with few
    output columns). ``lora`` (a ``gh200rt.lora.slots.LoraLinear``, set by ``install_lora``) adds the step's
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
        invariant = getattr(weight, "invariant_form", None)
        invariant = None if invariant is None else invariant()
        if invariant is not None:   # computes a row alike at every row count: the step's rows in one call
            return invariant.linear(x, self.bias)
        if isinstance(weight, PackedWeight):   # dequantized once per call, not once per block
            weight = weight.block_form(x, block_rows, native=self.packed_native)

        def linear(rows: torch.Tensor) -> torch.Tensor:
            return self._block_linear(weight, rows)
        cuts = ROW_BLOCK_SIZES.cuts(self._route(weight, x), linear, x.shape[-1], x.dtype, block_rows,
                                    x.numel() // x.shape[-1]) if x.numel() else None
        return in_row_blocks(linear, x, block_rows, cuts)

    def _block_linear(self, weight, x: torch.Tensor) -> torch.Tensor:
        if isinstance(weight, torch.Tensor) and _blocks_on_onednn(x, weight, self.bias):
            return onednn_linear(x, weight, self.bias)
        return self._linear(weight, x)

    def _route(self, weight, x: torch.Tensor) -> tuple:
        """What decides the kernel a block runs, and so how it sums a row (``RowBlockSizes``' key)."""
        if isinstance(weight, torch.Tensor):
            form = ("dense", weight.dtype, tuple(weight.shape), weight.device.type, weight.is_contiguous())
        else:
            form = (type(weight).__qualname__, getattr(weight, "fmt", None), getattr(weight, "group_size", None),
                    getattr(weight, "dtype", None), tuple(getattr(weight, "shape", ())))
        return form, self.bias is not None, self.dense_fn, self.packed_native, x.dtype, x.device.type

    def _linear(self, weight, x: torch.Tensor) -> torch.Tensor:
        if isinstance(weight, torch.Tensor):
            return self.dense_fn(x, weight, self.bias)
        if isinstance(weight, HalfWeight):
            return weight.linear(x, self.bias, native=self.packed_native)
        if not isinstance(weight, PackedWeight):
            return weight.linear(x, self.bias)
        dense = weight.dense_for(x, native=self.packed_native)
        if dense is not None:
            return self.dense_fn(x, dense, self.bias)
        return weight.linear(x, self.bias, native=self.packed_native)


def _blocks_on_onednn(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    return (x.dtype == torch.float32 and weight.dtype == torch.float32 and x.device.type == "cpu"
            and weight.device.type == "cpu" and weight.dim() == 2 and weight.is_contiguous()
            and (bias is None or bias.dtype == torch.float32)
            and not (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad)) and onednn_available())
