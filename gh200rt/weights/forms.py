"""The form an offloaded linear weight takes in host memory (``--host-weight-dtype``).

``resolve_host_format`` turns the flag into one concrete format once per engine:
- ``auto`` keeps a dense checkpoint's compute dtype (the same bits as a resident weight, so every
  placement computes what all-resident computes, and a layer promoted back to HBM holds the
  checkpoint's weights, not a rounding of them); on a GPU it keeps a quantized checkpoint's own
  weights (``GGUF``: GGUF Q8_0 / Q4_0 / Q4_1 blocks or an FP8 checkpoint's fp8 weights, lossless).
- ``fp32`` / ``bf16`` / ``fp16`` / ``int8`` / ``int4`` / ``fp8`` convert at load (``formats.pack.pack_weight``);
  ``fp8`` of an FP8 checkpoint takes its fp8 weights as they are.

``host_form`` returns a dense tensor or a ``PackedWeight``; ``storage_parts`` lists the tensors a
slab must hold for it and ``bind`` rebuilds the weight over views of a slab or staging slot.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from gh200rt.formats.pack import PackedWeight, pack_weight
from gh200rt.formats.packed_weight import concat_rows
from gh200rt.formats.quantizers import empty_packed

GGUF = "gguf"
_DTYPE_FORMATS = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


def resolve_host_format(flag: str, on_cpu: bool, compute_dtype: torch.dtype, has_quantized: bool) -> str:
    """One of ``fp32`` / ``bf16`` / ``fp16`` (dense), ``int8``, ``int4`` or ``gguf`` (the checkpoint's blocks)."""
    if flag != "auto":
        return flag
    if on_cpu or not has_quantized:
        return _DTYPE_FORMATS[compute_dtype]
    return GGUF


def planning_format(fmt: str, quantized: dict | None = None) -> str:
    """The format the cost model sizes a slab with (GGUF Q4_x blocks import as int4 groups of 32; an FP8
    checkpoint's weights stay fp8)."""
    if fmt != GGUF:
        return fmt
    return "fp8" if is_fp8_checkpoint(quantized) else "int4"


def fp8_group(quantized: dict | None) -> int | None:
    """The columns per scale of a block-FP8 checkpoint's weights (None: per-channel scales, or no fp8 weights)."""
    groups = {q.group_size for q in (quantized or {}).values()
              if isinstance(q, PackedWeight) and q.fmt == "fp8" and q.group_size < q.shape[1]}
    return min(groups) if groups else None


def is_fp8_checkpoint(quantized: dict | None) -> bool:
    """Whether the loader's quantized tensors are an FP8 checkpoint's weights."""
    return any(isinstance(q, PackedWeight) and q.fmt == "fp8" for q in (quantized or {}).values())


class UpcastWeight:
    """A dense weight in a narrower dtype than the compute dtype (``--host-weight-dtype`` narrower than the
    model), upcast to the activation dtype and accumulated there. On a GPU ``host_gemm`` upcasts each tile in
    registers, as it does for the direct tier: upcasting the whole weight first would allocate a copy of it
    on every call (inside a captured graph: in the graph's pool, outside the ledger)."""
    __slots__ = ("tensor",)

    def __init__(self, tensor: torch.Tensor):
        self.tensor = tensor

    @property
    def nbytes(self) -> int:
        return self.tensor.nbytes

    def storage(self) -> dict[str, torch.Tensor]:
        """The memory this weight reads (what a captured graph sees)."""
        return {"tensor": self.tensor}

    def linear(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        if self.tensor.is_cuda:
            from gh200rt.kernels.triton import host_gemm as host_gemm_module
            return host_gemm_module.host_gemm(x, self.tensor, bias)
        return F.linear(x, self.tensor.to(x.dtype), bias)

    def __repr__(self) -> str:
        return f"UpcastWeight({list(self.tensor.shape)}, {self.tensor.dtype}, at 0x{self.tensor.data_ptr():x})"


QUANTIZED_HOST_FORMATS = ("int8", "int4", "int4-g128", "fp8")   # host formats that quantize a dense weight at load


def empty_host_form(dense: torch.Tensor, fmt: str):
    """``host_form(dense, fmt)``'s layout over storage-free tensors, for a dense weight and a quantized format (what
    the slab cache compares a stored slab with), computed from the shape alone."""
    assert fmt in QUANTIZED_HOST_FORMATS, fmt
    return empty_packed(fmt, tuple(dense.shape))


def host_form(dense: torch.Tensor, fmt: str, gguf_parts: list | None = None, workers: int = 1):
    """What a slab stores for one linear: ``dense`` is the loaded weight, ``gguf_parts`` the checkpoint's
    quantized tensors that make it up (in row order), when the checkpoint was a GGUF file or FP8; ``workers``:
    threads that quantize (``formats.quantizers.quantize_rows``)."""
    if gguf_parts and (fmt == GGUF or (fmt == "fp8" and all(isinstance(p, PackedWeight) for p in gguf_parts))):
        return concat_rows([pack_weight(part, "auto") for part in gguf_parts])
    if fmt == GGUF:
        return dense  # a tensor the checkpoint stored unquantized, as loaded
    if _DTYPE_FORMATS.get(dense.dtype) == fmt:
        return dense
    return pack_weight(dense, fmt, workers)


def storage_parts(form) -> dict[str, torch.Tensor]:
    """The tensors a slab holds for ``form``, in layout order."""
    if isinstance(form, torch.Tensor):
        return {"weight": form}
    return form.tensors()


def bind(form, views: dict[str, torch.Tensor], compute_dtype: torch.dtype, stable: bool, wrap_dense=None):
    """``form`` rebuilt over ``views`` (same names, shapes and dtypes as ``storage_parts(form)``).

    ``stable=False`` marks storage whose contents change between calls (a staging slot): a packed
    weight must not cache anything derived from it. ``wrap_dense`` turns a dense view into what a
    WeightRef holds (e.g. a GPU direct-read weight); by default the view itself."""
    if not isinstance(form, torch.Tensor):
        return form.with_tensors(views, stable=stable)
    weight = views["weight"]
    if wrap_dense is not None and weight.device.type != "cpu":
        # a GPU reading host memory in place: host_gemm upcasts each weight tile in registers; an
        # UpcastWeight here would copy the whole weight into HBM on every call, outside the ledger
        return wrap_dense(weight)
    if weight.dtype != compute_dtype:
        return UpcastWeight(weight)
    return wrap_dense(weight) if wrap_dense is not None else weight
