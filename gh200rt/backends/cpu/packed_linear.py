"""How a ``PackedWeight`` multiplies activations on the CPU: the routes, and the derived forms of storage they keep
(in the weight's ``derived``).

Float32 activations against int8 / int4 weights (groups of a multiple of 32) go through the native quantized
linear (``kernels/cpu/quant_linear.c``: the packed bytes read in place, activations rounded to int16 per block of 32
columns, integer dot products, float32 accumulation; relative error ~3e-5 against the dequantized float32
reference, and a row's result does not depend on the rows beside it) up to ``NATIVE_MAX_ROWS`` rows, and through
one native dequantize and a float32 GEMM above. Without the native library (no C compiler), torch's exact
int8/int4 weight-only ops serve a single row where the layout allows, dequantize-then-matmul the rest. bf16
activations (the bf16 CPU route) run torch's ops in bf16 at every M (int8 per channel, int4 g32-256);
``cpu_route="fbgemm"`` (int8 per channel) trades accuracy for speed (docs/benchmarks/kernels.md).

Some CPU routes need a derived form of the storage (torch's int4 layout, an fbgemm packed
matrix). ``stable=False`` (``with_tensors(..., stable=False)``, used for staging slots whose
contents change between calls) derives it on every call instead of caching it, so a weight is
always computed from the bytes it sits on now. The route itself never depends on ``stable``:
the same bytes give the same bits in every tier.
"""
from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F

from gh200rt.backends.cpu.linear import NATIVE_F32_MAX_ROWS
from gh200rt.backends.cpu.native import load_native_ops
from gh200rt.backends.cpu.native_args import quant_linear_fits
from gh200rt.backends.cpu.native_checks import fp8_linear_fits
from gh200rt.formats.packed_layout import unpack_int4

_CPU_INT4_GROUPS = (32, 64, 128, 256)
# Row counts up to which float32 activations go through the native quantized linear; above it one native
# dequantize and a float32 GEMM, which the per-block integer sums stop beating between 8 and 32 rows
# (SmolLM2's decoder linears on 2 AVX2 cores, docs/benchmarks/kernels.md).
NATIVE_MAX_ROWS = 16


def dense_for(weight, x: torch.Tensor, native: bool = True) -> torch.Tensor | None:
    """The dense float32 weight when this form multiplies ``x`` as that dense weight would (fp8 with float32
    activations on the CPU, where the native fp8 linear does not take the call: ``fp8_native``), else None. A layer
    then multiplies it through its own dense route, so fp8 bytes give the dequantized model's bits on every kernel
    choice (the native fp8 linear gives f32_linear's, the dense route of those rows)."""
    if weight.fmt == "fp8" and x.dtype == torch.float32:
        return None if native and fp8_native(weight, x) is not None else weight.dequantize()
    return None


def fp8_native(weight, x: torch.Tensor):
    """The native fp8 linear (``kernels/cpu/fp8_linear.c``: codes and scales read in place) where it takes this
    call: float32 or bf16 CPU rows, 1 to ``NATIVE_F32_MAX_ROWS`` of them (the rows a dense float32 weight sends to
    ``f32_linear``, whose bits over the dequantized weight it gives), a weight it reads (decided once per weight)."""
    if x.dtype not in (torch.float32, torch.bfloat16) or not x.numel() or not x.is_cpu \
            or x.numel() // x.shape[-1] > NATIVE_F32_MAX_ROWS:
        return None
    if "native_fp8" not in weight.derived:
        ops = load_native_ops()
        fits = ops is not None and fp8_linear_fits(weight.qweight, weight.scale, weight.group_size)
        weight.derived["native_fp8"] = ops if fits else False
    return weight.derived["native_fp8"] or None


def block_form(weight, x: torch.Tensor, rows: int, native: bool = True):
    """What each block of ``rows`` rows of ``x`` multiplies when a call runs in row blocks
    (gh200rt/models/layers/row_blocks.py): the dense float32 weight, dequantized once for the whole call,
    where a block of that many rows would dequantize anyway; else this weight."""
    dense = dense_for(weight, x)
    if dense is not None or x.dtype != torch.float32:
        return weight if dense is None else dense
    ops = native_ops(weight) if native else None
    if ops is not None:
        return ops.dequantize(weight) if rows > NATIVE_MAX_ROWS else weight
    fbgemm_rows = weight.fmt == "int8" and weight.group_size >= weight.shape[1] and weight.cpu_route == "fbgemm"
    return weight.dequantize() if rows > 1 and not fbgemm_rows else weight


def linear(weight, x: torch.Tensor, bias: torch.Tensor | None, native: bool = True) -> torch.Tensor:
    n, k = weight.shape
    lead = x.shape[:-1]
    fp8 = fp8_native(weight, x) if native and weight.fmt == "fp8" else None
    if fp8 is not None:    # the bias after the kernel: the same one addition f32_linear's own bias makes
        y = fp8.fp8_linear_checked(x if x.dtype == torch.float32 else x.float(), weight.qweight, weight.scale,
                                   weight.group_size, None)
        if bias is not None:
            y = y + bias.to(y.dtype)
        return y if y.dtype == x.dtype else y.to(x.dtype)
    if x.dtype == torch.bfloat16 and x.numel() and _bf16_op_ok(weight):
        y = _linear_bf16(weight, x.reshape(-1, k).contiguous())
        if bias is not None:
            y = y + bias.to(y.dtype)
        return y.reshape(*lead, n)
    native = native_ops(weight) if native else None
    if native is not None:
        rows = x.numel() // k if k else 0
        y = native.quant_linear(x, weight) if rows <= NATIVE_MAX_ROWS \
            else F.linear(x.reshape(-1, k).to(torch.float32), native.dequantize(weight)).reshape(*lead, n)
        if bias is not None:
            y = y + bias.to(y.dtype)
        return y if y.dtype == x.dtype else y.to(x.dtype)
    x2 = x.reshape(-1, k).to(torch.float32).contiguous()
    # torch's weight-only ops take float32 rows one at a time (their cost grows with M), so they
    # only win for a single row; more rows dequantize once and run one float32 matmul.
    single = x2.shape[0] == 1
    if weight.fmt == "int8" and weight.group_size >= k and weight.cpu_route == "fbgemm":
        packed = fbgemm_form(weight)  # one row at a time: activation ranges stay per token
        y = torch.cat([torch.ops.quantized.linear_dynamic(row, packed, True) for row in x2.split(1)])
    elif single and weight.fmt == "int8" and weight.group_size >= k:
        y = torch._weight_int8pack_mm(x2, weight.qweight, weight.scale[:, 0])
    elif single and weight.fmt == "int4" and _cpu_int4_ok(weight):
        packed, scales_and_zeros = _cpu_int4_form(weight)
        y = torch._weight_int4pack_mm_for_cpu(x2, packed, weight.group_size, scales_and_zeros)
    else:
        y = x2 @ weight.dequantize().T
    if bias is not None:
        y = y + bias.to(y.dtype)
    return y.to(x.dtype).reshape(*lead, n)


def native_ops(weight):
    """The native quantized linear (``kernels/cpu/quant_linear.c``) when it is built and takes this weight
    (decided once per weight object)."""
    if "native" not in weight.derived:
        ops = load_native_ops() if weight.cpu_route == "exact" else None
        weight.derived["native"] = ops if ops is not None and quant_linear_fits(weight) else False
    return weight.derived["native"] or None


def _bf16_op_ok(weight) -> bool:
    return (weight.fmt == "int8" and weight.group_size >= weight.shape[1] and weight.cpu_route == "exact") \
        or (weight.fmt == "int4" and _cpu_int4_ok(weight))


def _linear_bf16(weight, x2: torch.Tensor) -> torch.Tensor:
    # bf16 activations (the bf16 CPU route): torch's weight-only ops run native bf16 dot products at
    # every M, 2.4x (int8) / 4.6x (int4) the fp32 step at M=1 (docs/benchmarks/kernels.md).
    if weight.fmt == "int8":
        return torch._weight_int8pack_mm(x2, weight.qweight, _bf16_scale(weight))
    packed, scales_and_zeros = _cpu_int4_form(weight)
    return torch._weight_int4pack_mm_for_cpu(x2, packed, weight.group_size, _bf16_scale(weight, scales_and_zeros))


def _bf16_scale(weight, scales_and_zeros: torch.Tensor | None = None) -> torch.Tensor:
    if "bf16_scales" in weight.derived:
        return weight.derived["bf16_scales"]
    scale = (weight.scale[:, 0] if scales_and_zeros is None else scales_and_zeros).to(torch.bfloat16)
    if weight.stable:
        weight.derived["bf16_scales"] = scale
    return scale


def _cpu_int4_ok(weight) -> bool:
    n, k = weight.shape
    return weight.group_size in _CPU_INT4_GROUPS and k % weight.group_size == 0 and k % 2 == 0


def _cpu_int4_form(weight) -> tuple[torch.Tensor, torch.Tensor]:
    # torch's CPU int4 op dequantizes as (q - 8) * scale + zero, so zero = minimum + 8 * scale.
    if "cpu_int4" in weight.derived:
        return weight.derived["cpu_int4"]
    q = unpack_int4(weight.qweight, weight.shape[1]).to(torch.int32)
    packed = torch._convert_weight_to_int4pack_for_cpu(q, 1)
    zeros = weight.minimum + 8.0 * weight.scale
    form = (packed, torch.stack([weight.scale.T, zeros.T], dim=-1).contiguous())
    if weight.stable:
        weight.derived["cpu_int4"] = form
    return form


def fbgemm_form(weight):
    # fbgemm's dynamic linear also quantizes activations (per call, 7-bit): ~3.5x faster than
    # fp32 at decode on AVX2 but visibly less accurate (docs/benchmarks/kernels.md), so opt-in.
    if "fbgemm" in weight.derived:
        return weight.derived["fbgemm"]
    n = weight.shape[0]
    # The route (a comparison point for the benchmarks `kernel quant-cpu` and `accuracy --formats`; no engine flag
    # selects it) needs torch's quantized tensors, which torch has deprecated: quiet the warning per call, and say
    # what to use once they are gone.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*quantized tensor creation functions.*deprecated")
        try:
            q = torch._make_per_channel_quantized_tensor(weight.qweight, weight.scale[:, 0].double(),
                                                         torch.zeros(n, dtype=torch.long), 0)
            packed = torch.ops.quantized.linear_prepack(q, None)
        except AttributeError as err:
            raise RuntimeError(f"cpu_route='fbgemm' needs torch's quantized tensors, which this torch "
                               f"({torch.__version__}) does not provide; use cpu_route='exact' (the native "
                               f"quantized linear)") from err
    if weight.stable:
        weight.derived["fbgemm"] = packed
    return packed
