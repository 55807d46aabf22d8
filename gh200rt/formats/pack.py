"""Weight-only host formats: ``pack_weight``, the one entry point that makes a linear weight's host form, and the
plain-torch reference every form's linear is checked against.

``HOST_FORMATS`` (``--host-weight-dtype``): ``fp32`` / ``bf16`` give a dense tensor, ``fp16`` a ``HalfWeight``
(``half_weight.py``), ``int8`` / ``int4`` / ``fp8`` a ``PackedWeight``: the layouts in ``packed_layout.py``, the
weight in ``packed_weight.py``, the quantizers in ``quantizers.py`` (how each multiplies: its backend's module).

``PackedWeight``, ``HalfWeight`` and ``quantize_int8`` / ``quantize_int4`` / ``quantize_fp8`` are re-exported here,
where most of their callers import them from.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from gh200rt.formats.half_weight import HalfWeight
from gh200rt.formats.packed_weight import PackedWeight
from gh200rt.formats.quantizers import quantize_fp8, quantize_int4, quantize_int8, quantize_rows

__all__ = ["HOST_FORMATS", "HalfWeight", "PackedWeight", "pack_weight", "quantize_fp8", "quantize_int4",
           "quantize_int8", "reference_linear"]

HOST_FORMATS = ("fp32", "bf16", "fp16", "int8", "int4", "int4-g128", "fp8")


def pack_weight(weight, fmt: str, workers: int = 1) -> torch.Tensor | PackedWeight:
    """The host-memory form of one linear weight for ``--host-weight-dtype``.

    ``weight`` is a dense ``[N, K]`` tensor (bf16/fp16/fp32) or a GGUF quantized tensor (any
    object with ``ggml_type``, ``data``/``raw`` and ``shape``, see ``gguf_blocks``). ``fmt``:
    ``auto`` keeps GGUF tensors in their own format (lossless) and dense tensors as bf16;
    ``fp32`` / ``bf16`` give a dense tensor of that dtype; ``fp16`` a ``HalfWeight``; ``int8`` / ``int4`` /
    ``int4-g128`` (int4 in groups of 128 columns) / ``fp8`` a ``PackedWeight``. A ``PackedWeight`` (e.g. an FP8 checkpoint's weight) is kept when ``fmt`` is ``auto``
    or its own format, else dequantized and converted. ``workers``: threads quantizing (``quantize_rows``).
    """
    from gh200rt.formats.gguf_blocks import from_gguf, is_gguf_tensor
    choices = ("auto",) + HOST_FORMATS
    if fmt not in choices:
        raise ValueError(f"host weight format {fmt!r}: choose one of {', '.join(choices)} (--host-weight-dtype)")
    if is_gguf_tensor(weight):
        packed = from_gguf(weight)
        if fmt == "auto" or fmt == packed.fmt:
            return packed
        weight = packed.dequantize()
    if isinstance(weight, PackedWeight):
        if fmt in ("auto", weight.fmt):
            return weight
        weight = weight.dequantize()
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
        raise ValueError(f"pack_weight needs a 2-D [out, in] tensor or a GGUF tensor, got {type(weight).__name__}"
                         f"{tuple(weight.shape) if isinstance(weight, torch.Tensor) else ''}")
    if fmt in ("auto", "bf16"):
        return weight.detach().to(torch.bfloat16).contiguous()
    if fmt == "fp32":
        return weight.detach().to(torch.float32).contiguous()
    if fmt == "fp16":
        return _to_half(weight)
    return quantize_rows(weight, fmt, workers)


def _to_half(weight: torch.Tensor) -> HalfWeight:
    largest = weight.detach().abs().max().item() if weight.numel() else 0.0
    if largest > torch.finfo(torch.float16).max:
        raise ValueError(f"a weight of shape {tuple(weight.shape)} holds {largest:.3g}, beyond float16's range "
                         "(65504): use --host-weight-dtype bf16 for this model")
    return HalfWeight(weight.detach().to(torch.float16).contiguous())


def reference_linear(x: torch.Tensor, weight: PackedWeight | HalfWeight,
                     bias: torch.Tensor | None = None) -> torch.Tensor:
    """Plain torch: dequantize then matmul in float32."""
    return F.linear(x.to(torch.float32), weight.dequantize().to(x.device),
                    None if bias is None else bias.to(torch.float32))
