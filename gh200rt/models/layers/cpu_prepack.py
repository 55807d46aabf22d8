"""Resident CPU linear weights converted once, at start-up, into the form the CPU route multiplies fastest.

``cpu_route_form(weight, linear_format)`` is the form a resident dense weight takes for the route
chosen in ``platform/cpu_features.py``; the weight store applies it to every resident linear
(decoder layers and the lm_head):

* ``onednn-bf16`` -> ``OneDNNWeight``: the bf16 weight reordered into oneDNN's blocked layout
  (``torch.ops.mkldnn._reorder_linear_weight``) and multiplied by oneDNN's inner product. At decode
  and prefill shapes it is faster than ``F.linear`` over the same bf16 tensor (which reorders the
  weight on every call) with the same arithmetic (bf16 products, fp32 accumulation; the tests
  compare the two).
* ``fp16`` -> ``HalfWeight`` (fbgemm's fp16 GEMM, float32 activations).

Only resident weights are converted: a streamed layer's slot changes every step and a direct
layer's host slab is in the format ``--host-weight-dtype`` chose. The dense original is released
(the reordered copy replaces it), except a tied lm_head, whose tensor the embedding still reads.
"""
from __future__ import annotations

import torch

from gh200rt.kernels.quant import pack_weight


class OneDNNWeight:
    """A bf16 ``[N, K]`` weight in oneDNN's reordered layout (satisfies the ``WeightRef`` contract)."""
    __slots__ = ("packed", "shape", "dtype", "nbytes")

    def __init__(self, weight: torch.Tensor):
        assert weight.dtype == torch.bfloat16 and weight.dim() == 2 and weight.device.type == "cpu"
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), None)
        self.shape, self.dtype = tuple(weight.shape), weight.dtype
        self.nbytes = weight.nbytes  # the reordered copy holds the same values (plus block padding)

    def linear(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        if x.dtype != torch.bfloat16:
            raise TypeError(f"OneDNNWeight multiplies bf16 activations, got {x.dtype}")
        if x.numel() == 0:
            return x.new_empty(*x.shape[:-1], self.shape[0])
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, bias, "none", [], "")

    def __repr__(self) -> str:
        return f"OneDNNWeight(shape={self.shape})"


def cpu_route_form(weight: torch.Tensor, fmt: str):
    if fmt == "onednn-bf16":
        return OneDNNWeight(weight) if weight.dtype == torch.bfloat16 else weight
    if fmt == "fp16":
        try:
            half = pack_weight(weight, "fp16")
        except ValueError:  # beyond fp16's range: this weight stays dense
            return weight
        half._fbgemm_form()  # build fbgemm's packed copy now, not inside the first request
        return half
    raise ValueError(f"unknown CPU linear format {fmt!r}")


def linear_formats(model) -> dict[str, int]:
    """How many of the model's linears hold each weight form (for start-up logs and tests)."""
    counts: dict[str, int] = {}
    refs = [r for i in range(len(model.layers)) for r in model.layer_weight_refs(i).values()]
    for ref in refs + [model.lm_head.weight_ref]:
        cur = ref.current
        name = f"dense {str(cur.dtype).removeprefix('torch.')}" if isinstance(cur, torch.Tensor) \
            else type(cur).__name__
        counts[name] = counts.get(name, 0) + 1
    return counts
