"""How a ``HalfWeight`` (fp16 host format) multiplies activations on the CPU, and whether fbgemm's fp16 GEMM runs
here.

Float32 activations: up to ``NATIVE_F16_MAX_ROWS`` rows the native fp16 linear reads the tensor in place (with the
native CPU kernels built and ``native``: off for ``--cpu-kernels torch``); more rows fbgemm's fp16 GEMM (float32
accumulation, fp16 weights widened in registers: ~2x the fp32 GEMM at decode, and exact for the fp16 weight) over
fbgemm's packed copy of the weight, built at first use (or at start-up, its pieces side by side: fbgemm packs on
one core and releases the GIL) and kept in the weight's ``derived`` when ``stable``, and on every call otherwise (~80x
a decode GEMM: correct, not fast); without fbgemm, the weight is widened to the activation dtype on every call.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import torch
import torch.nn.functional as F

from gh200rt.backends.cpu.native import load_native_ops

# Row counts up to which float32 activations against an fp16 weight go through the native fp16 linear
# (kernels/cpu/f16_linear.c) instead of fbgemm's fp16 GEMM: a decode step of a few sequences, where the two cost
# about the same per linear and the native one lets the whole decoder layer run in one native call
# (backends/cpu/decode_layer.py; docs/benchmarks/kernels.md).
NATIVE_F16_MAX_ROWS = 8
# fbgemm packs a tall weight several times slower per value than one of a few thousand rows (a 49,152-token LM head:
# 1.3-1.6 s whole against 0.5 s in pieces of 4,096 rows on a first-gen Zen), so a weight of more rows is packed in
# pieces of this many and their outputs joined. A column's bits depend on the kernel's column tile it falls in (a
# partial tile computes otherwise): a multiple of every tile width (16-64 columns) keeps each column's tile, and
# with it the whole copy's bits
FBGEMM_PACK_ROWS = 4096


def linear(weight, x: torch.Tensor, bias: torch.Tensor | None = None, native: bool = True) -> torch.Tensor:
    ops = native_ops(weight) if native else None
    if ops is not None and x.dtype == torch.float32 and 0 < x.numel() <= NATIVE_F16_MAX_ROWS * weight.shape[1] \
            and (bias is None or (bias.dtype == torch.float32 and bias.is_cpu)):
        return ops.f16_linear_checked(x, weight.weight, bias)
    if x.dtype != torch.float32 or x.numel() == 0 or not fbgemm_fp16_available():
        return F.linear(x, weight.weight.to(x.dtype), None if bias is None else bias.to(x.dtype))
    y = fbgemm_linear(x.reshape(-1, weight.shape[1]), weight)
    if bias is not None:
        y = y + bias
    return y.reshape(*x.shape[:-1], weight.shape[0])


def native_ops(weight):
    """The native CPU ops when they take this weight (a CPU tensor with unit column stride), else None."""
    if "native" not in weight.derived:
        ops = load_native_ops() if weight.weight.is_cpu and weight.weight.stride(-1) == 1 else None
        weight.derived["native"] = ops if ops is not None else False
    return weight.derived["native"] or None


def fbgemm_linear(x: torch.Tensor, weight) -> torch.Tensor:
    """``x [M, K]`` times the fp16 weight through fbgemm's packed copy (its pieces' outputs side by side)."""
    pieces = fbgemm_form(weight)
    if len(pieces) == 1:
        return torch.ops.quantized.linear_dynamic_fp16(x, pieces[0])
    return torch.cat([torch.ops.quantized.linear_dynamic_fp16(x, piece) for piece in pieces], dim=1)


def fbgemm_form(weight, threads: int = 1) -> list:
    """fbgemm's packed copies of the weight's rows, ``FBGEMM_PACK_ROWS`` at a time; a stable weight's pieces are
    packed on up to ``threads`` threads."""
    if "fbgemm" in weight.derived:
        return weight.derived["fbgemm"]
    rows = weight.weight
    starts = range(0, max(rows.shape[0], 1), FBGEMM_PACK_ROWS)

    def pack(start: int):
        return torch.ops.quantized.linear_prepack_fp16(rows[start:start + FBGEMM_PACK_ROWS].contiguous(), None)
    if not weight.stable or len(starts) == 1 or threads < 2:
        pieces = [pack(start) for start in starts]
    else:
        with ThreadPoolExecutor(min(len(starts), threads)) as pool:
            pieces = list(pool.map(pack, starts))
    if weight.stable:
        weight.derived["fbgemm"] = pieces
    return pieces


_fbgemm_fp16_ok: bool | None = None  # None: not probed yet


def fbgemm_fp16_available() -> bool:
    """Whether torch's fbgemm fp16 GEMM runs here and agrees with F.linear (probed once per process)."""
    global _fbgemm_fp16_ok
    if _fbgemm_fp16_ok is None:
        gen = torch.Generator().manual_seed(0)
        w, x = torch.randn(24, 40, generator=gen).half(), torch.randn(3, 40, generator=gen)
        try:
            y = torch.ops.quantized.linear_dynamic_fp16(x, torch.ops.quantized.linear_prepack_fp16(w, None))
            _fbgemm_fp16_ok = torch.allclose(y, F.linear(x, w.float()), rtol=1e-5, atol=1e-5)
        except (AttributeError, NotImplementedError, RuntimeError):
            _fbgemm_fp16_ok = False
    return _fbgemm_fp16_ok
