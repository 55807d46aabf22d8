"""Weight-only formats for host-resident weights, and the one entry point that makes them.

``fp16`` (``HalfWeight``) is the dense weight rounded to float16; activations keep their dtype.
Three quantized formats, all over a logical dense weight ``W[N, K]`` (out, in) split along K into
groups of ``group_size`` columns (``group_size == K`` means one group per output channel):

* ``int8``: ``qweight`` int8 ``[N, K]``; ``W = q * scale``.
* ``fp8``: ``qweight`` float8_e4m3fn ``[N, K]``, one group per output channel; ``W = q * scale``
  (the layout of Hugging Face FP8 checkpoints, whose per-tensor or per-channel ``weight_scale``
  becomes a per-row scale without loss).
* ``int4``: ``qweight`` uint8 ``[N, ceil(K/2)]``, column ``k`` in byte ``k // 2`` (low nibble for
  even k); ``W = q * scale + minimum`` with ``q`` in 0..15.

``scale`` / ``minimum`` are float32 ``[N, ceil(K/group_size)]``. GGUF Q8_0 maps onto int8 with
group 32, Q4_1 onto int4 (scale d, minimum m) and Q4_0 onto int4 (scale d, minimum -8d) without
loss. ``PackedWeight`` and ``HalfWeight`` satisfy the ``WeightRef`` contract (``linear(x, bias)``,
``nbytes``): on CUDA they call ``host_gemm``. On CPU, float32 activations against int8 / int4 weights
(groups of a multiple of 32) go through the native quantized linear (``kernels/cpu/quant_linear.c``:
the packed bytes read in place, activations rounded to int16 per block of 32 columns, integer dot
products, float32 accumulation; relative error ~3e-5 against the dequantized float32 reference, and a
row's result does not depend on the rows beside it) up to ``NATIVE_MAX_ROWS`` rows, and through one
native dequantize and a float32 GEMM above. Without the native library (no C compiler), torch's exact
int8/int4 weight-only ops serve a single row where the layout allows, dequantize-then-matmul the
rest. bf16 activations (the bf16 CPU route) run torch's ops in bf16 at every M (int8 per channel,
int4 g32-256); ``cpu_route="fbgemm"`` (int8 per channel) trades accuracy for speed
(docs/benchmarks/kernels.md).

Some CPU routes need a derived form of the storage (torch's int4 layout, an fbgemm packed
matrix). ``stable=False`` (``with_tensors(..., stable=False)``, used for staging slots whose
contents change between calls) derives it on every call instead of caching it, so a weight is
always computed from the bytes it sits on now. The route itself never depends on ``stable``:
the same bytes give the same bits in every tier.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import warnings

import torch
import torch.nn.functional as F

HOST_FORMATS = ("fp32", "bf16", "fp16", "int8", "int4", "fp8")
FP8_MAX = torch.finfo(torch.float8_e4m3fn).max  # 448
INT4_DEFAULT_GROUP = 32
CPU_ROUTES = ("exact", "fbgemm")
_CPU_INT4_GROUPS = (32, 64, 128, 256)
# Row counts up to which float32 activations go through the native quantized linear; above it one native
# dequantize and a float32 GEMM, which the per-block integer sums stop beating between 8 and 32 rows
# (SmolLM2's decoder linears on 2 AVX2 cores, docs/benchmarks/kernels.md).
NATIVE_MAX_ROWS = 16
# Row counts up to which float32 activations against an fp16 weight go through the native fp16 linear
# (kernels/cpu/f16_linear.c) instead of fbgemm's fp16 GEMM: a decode step of a few sequences, where the two cost
# about the same per linear and the native one lets the whole decoder layer run in one native call
# (models/cpu_decode_layer.py; docs/benchmarks/kernels.md).
NATIVE_F16_MAX_ROWS = 8


class PackedWeight:
    """A quantized ``[N, K]`` weight (see the module docstring for the layout)."""

    def __init__(self, fmt: str, qweight: torch.Tensor, scale: torch.Tensor,
                 minimum: torch.Tensor | None, group_size: int, shape: tuple[int, int], cpu_route: str = "exact",
                 stable: bool = True):
        assert fmt in ("int8", "int4", "fp8"), fmt
        if cpu_route not in CPU_ROUTES:
            raise ValueError(f"cpu_route {cpu_route!r}: choose one of {', '.join(CPU_ROUTES)}")
        n, k = shape
        groups = -(-k // group_size)
        assert scale.shape == (n, groups) and scale.dtype == torch.float32, (scale.shape, scale.dtype)
        if fmt == "int8":
            assert qweight.dtype == torch.int8 and qweight.shape == (n, k) and minimum is None
        elif fmt == "fp8":
            assert qweight.dtype == torch.float8_e4m3fn and qweight.shape == (n, k) and minimum is None
            assert group_size == k, "fp8 weights carry one scale per output channel"
        else:
            assert qweight.dtype == torch.uint8 and qweight.shape == (n, (k + 1) // 2)
            assert minimum is not None and minimum.shape == (n, groups)
            assert group_size % 2 == 0, "both nibbles of a byte must share a group"
        self.fmt, self.qweight, self.scale, self.minimum = fmt, qweight, scale, minimum
        self.group_size, self.shape = group_size, (n, k)
        self.cpu_route, self.stable = cpu_route, stable
        self._cpu_int4: tuple[torch.Tensor, torch.Tensor] | None = None
        self._fbgemm = None
        self._bf16_scales: torch.Tensor | None = None
        self._native = None        # the native library's handle once checked, False when it does not apply
        self._native_args = None   # kernels.cpu_native.QuantWeight: this weight's argument block

    @property
    def nbytes(self) -> int:
        parts = [self.qweight, self.scale] + ([self.minimum] if self.minimum is not None else [])
        if self._cpu_int4 is not None:
            parts += list(self._cpu_int4)
        return sum(t.nbytes for t in parts)

    @property
    def device(self) -> torch.device:
        return self.qweight.device

    def tensors(self) -> dict[str, torch.Tensor]:
        """The storage a placement moves (host slab, staging slot): ``qweight``, ``scale`` [, ``minimum``]."""
        out = {"qweight": self.qweight, "scale": self.scale}
        if self.minimum is not None:
            out["minimum"] = self.minimum
        return out

    def with_tensors(self, tensors: dict[str, torch.Tensor], stable: bool = True) -> "PackedWeight":
        """The same weight over other storage (e.g. views into a slab or a slot), same shapes and dtypes.
        ``stable=False``: the storage's contents change between calls; cache nothing derived from it."""
        return PackedWeight(self.fmt, tensors["qweight"], tensors["scale"], tensors.get("minimum"),
                            self.group_size, self.shape, self.cpu_route, stable)

    def dequantize(self) -> torch.Tensor:
        """The dense float32 ``[N, K]`` weight."""
        n, k = self.shape
        if self.fmt == "fp8":
            return self.qweight.to(torch.float32) * self.scale
        q = self.qweight if self.fmt == "int8" else unpack_int4(self.qweight, k)
        if k % self.group_size == 0:  # scales broadcast over their group: one pass, no expanded copies
            w = q.view(n, -1, self.group_size) * self.scale[..., None]
            if self.minimum is not None:
                w += self.minimum[..., None]
            return w.view(n, k)
        w = q.to(torch.float32) * self.scale.repeat_interleave(self.group_size, dim=1)[:, :k]
        if self.minimum is not None:
            w += self.minimum.repeat_interleave(self.group_size, dim=1)[:, :k]
        return w

    def linear(self, x: torch.Tensor, bias: torch.Tensor | None = None, native: bool = True) -> torch.Tensor:
        """``native``: on the CPU, whether the native quantized linear may serve (off: torch's ops alone)."""
        if x.is_cuda:
            from .host_gemm import host_gemm
            return host_gemm(x, self, bias)
        return self._linear_cpu(x, bias, native)

    def dense_for(self, x: torch.Tensor) -> torch.Tensor | None:
        """The dense float32 weight when this form multiplies ``x`` as that dense weight would (fp8 with float32
        activations on the CPU: no faster exact route than dequantizing), else None. A layer then multiplies it
        through its own dense route, so fp8 bytes give the dequantized model's bits on every kernel choice."""
        if self.fmt == "fp8" and x.dtype == torch.float32 and not x.is_cuda:
            return self.dequantize()
        return None

    def block_form(self, x: torch.Tensor, rows: int, native: bool = True):
        """What each block of ``rows`` rows of ``x`` multiplies when a call runs in row blocks
        (gh200rt/models/layers/row_blocks.py): the dense float32 weight, dequantized once for the whole call,
        where a block of that many rows would dequantize anyway; else this weight."""
        dense = self.dense_for(x)
        if dense is not None or x.is_cuda or x.dtype != torch.float32:
            return self if dense is None else dense
        ops = self._native_ops() if native else None
        if ops is not None:
            return ops.dequantize(self) if rows > NATIVE_MAX_ROWS else self
        fbgemm_rows = self.fmt == "int8" and self.group_size >= self.shape[1] and self.cpu_route == "fbgemm"
        return self.dequantize() if rows > 1 and not fbgemm_rows else self

    def _linear_cpu(self, x: torch.Tensor, bias: torch.Tensor | None, native: bool = True) -> torch.Tensor:
        n, k = self.shape
        lead = x.shape[:-1]
        if x.dtype == torch.bfloat16 and x.numel() and self._bf16_op_ok():
            y = self._linear_bf16(x.reshape(-1, k).contiguous())
            if bias is not None:
                y = y + bias.to(y.dtype)
            return y.reshape(*lead, n)
        native = self._native_ops() if native else None
        if native is not None:
            rows = x.numel() // k if k else 0
            y = native.quant_linear(x, self) if rows <= NATIVE_MAX_ROWS \
                else F.linear(x.reshape(-1, k).to(torch.float32), native.dequantize(self)).reshape(*lead, n)
            if bias is not None:
                y = y + bias.to(y.dtype)
            return y if y.dtype == x.dtype else y.to(x.dtype)
        x2 = x.reshape(-1, k).to(torch.float32).contiguous()
        # torch's weight-only ops take float32 rows one at a time (their cost grows with M), so they
        # only win for a single row; more rows dequantize once and run one float32 matmul.
        single = x2.shape[0] == 1
        if self.fmt == "int8" and self.group_size >= k and self.cpu_route == "fbgemm":
            packed = self._fbgemm_form()  # one row at a time: activation ranges stay per token
            y = torch.cat([torch.ops.quantized.linear_dynamic(row, packed, True) for row in x2.split(1)])
        elif single and self.fmt == "int8" and self.group_size >= k:
            y = torch._weight_int8pack_mm(x2, self.qweight, self.scale[:, 0])
        elif single and self.fmt == "int4" and self._cpu_int4_ok():
            packed, scales_and_zeros = self._cpu_int4_form()
            y = torch._weight_int4pack_mm_for_cpu(x2, packed, self.group_size, scales_and_zeros)
        else:
            y = x2 @ self.dequantize().T
        if bias is not None:
            y = y + bias.to(y.dtype)
        return y.to(x.dtype).reshape(*lead, n)

    def _native_ops(self):
        """The native quantized linear (``kernels/cpu/quant_linear.c``) when it is built and takes this weight
        (decided once per weight object)."""
        if self._native is None:
            from .cpu_native import load_native_ops, quant_linear_fits
            ops = load_native_ops() if self.cpu_route == "exact" else None
            self._native = ops if ops is not None and quant_linear_fits(self) else False
        return self._native or None

    def _bf16_op_ok(self) -> bool:
        return (self.fmt == "int8" and self.group_size >= self.shape[1] and self.cpu_route == "exact") \
            or (self.fmt == "int4" and self._cpu_int4_ok())

    def _linear_bf16(self, x2: torch.Tensor) -> torch.Tensor:
        # bf16 activations (the bf16 CPU route): torch's weight-only ops run native bf16 dot products at
        # every M, 2.4x (int8) / 4.6x (int4) the fp32 step at M=1 (docs/benchmarks/kernels.md).
        if self.fmt == "int8":
            return torch._weight_int8pack_mm(x2, self.qweight, self._bf16_scale())
        packed, scales_and_zeros = self._cpu_int4_form()
        return torch._weight_int4pack_mm_for_cpu(x2, packed, self.group_size, self._bf16_scale(scales_and_zeros))

    def _bf16_scale(self, scales_and_zeros: torch.Tensor | None = None) -> torch.Tensor:
        if self._bf16_scales is not None:
            return self._bf16_scales
        scale = (self.scale[:, 0] if scales_and_zeros is None else scales_and_zeros).to(torch.bfloat16)
        if self.stable:
            self._bf16_scales = scale
        return scale

    def _cpu_int4_ok(self) -> bool:
        n, k = self.shape
        return self.group_size in _CPU_INT4_GROUPS and k % self.group_size == 0 and k % 2 == 0

    def _cpu_int4_form(self) -> tuple[torch.Tensor, torch.Tensor]:
        # torch's CPU int4 op dequantizes as (q - 8) * scale + zero, so zero = minimum + 8 * scale.
        if self._cpu_int4 is not None:
            return self._cpu_int4
        q = unpack_int4(self.qweight, self.shape[1]).to(torch.int32)
        packed = torch._convert_weight_to_int4pack_for_cpu(q, 1)
        zeros = self.minimum + 8.0 * self.scale
        form = (packed, torch.stack([self.scale.T, zeros.T], dim=-1).contiguous())
        if self.stable:
            self._cpu_int4 = form
        return form

    def _fbgemm_form(self):
        # fbgemm's dynamic linear also quantizes activations (per call, 7-bit): ~3.5x faster than
        # fp32 at decode on AVX2 but visibly less accurate (docs/benchmarks/kernels.md), so opt-in.
        if self._fbgemm is not None:
            return self._fbgemm
        n = self.shape[0]
        # The route (a comparison point for scripts/bench_quant_cpu.py and eval_quant.py; no engine flag selects
        # it) needs torch's quantized tensors, which torch has deprecated: quiet the warning per call, and say
        # what to use once they are gone.
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*quantized tensor creation functions.*deprecated")
            try:
                q = torch._make_per_channel_quantized_tensor(self.qweight, self.scale[:, 0].double(),
                                                             torch.zeros(n, dtype=torch.long), 0)
                packed = torch.ops.quantized.linear_prepack(q, None)
            except AttributeError as err:
                raise RuntimeError(f"cpu_route='fbgemm' needs torch's quantized tensors, which this torch "
                                   f"({torch.__version__}) does not provide; use cpu_route='exact' (the native "
                                   f"quantized linear)") from err
        if self.stable:
            self._fbgemm = packed
        return packed

    def __repr__(self) -> str:
        return f"PackedWeight({self.fmt}, shape={self.shape}, group_size={self.group_size}, nbytes={self.nbytes})"


class HalfWeight:
    """A dense ``[N, K]`` weight stored in float16 (``fp16`` host format); activations keep their dtype.

    CUDA: ``host_gemm`` reads the fp16 tensor in place. CPU, float32 activations: up to
    ``NATIVE_F16_MAX_ROWS`` rows the native fp16 linear reads the tensor in place (with the native CPU
    kernels built and ``native``: off for ``--cpu-kernels torch``); more rows fbgemm's fp16 GEMM (float32
    accumulation, fp16 weights widened in registers: ~2x the fp32 GEMM at decode, and exact for the fp16
    weight) over fbgemm's packed copy of the weight, built at first use when ``stable`` and on every call
    otherwise (~80x a decode GEMM: correct, not fast); without fbgemm, the weight is widened to the
    activation dtype on every call.
    """
    fmt = "fp16"

    def __init__(self, weight: torch.Tensor, stable: bool = True):
        assert weight.dtype == torch.float16 and weight.dim() == 2, (weight.dtype, weight.shape)
        self.weight, self.stable = weight, stable
        self.shape = tuple(weight.shape)
        self._fbgemm = None
        self._native = None   # the native ops when they take this weight, False when not (decided once)

    @property
    def nbytes(self) -> int:
        # fbgemm's packed copy is opaque; it holds the same fp16 values (plus tile padding).
        return self.weight.nbytes * (2 if self._fbgemm is not None else 1)

    @property
    def device(self) -> torch.device:
        return self.weight.device

    def tensors(self) -> dict[str, torch.Tensor]:
        return {"weight": self.weight}

    def with_tensors(self, tensors: dict[str, torch.Tensor], stable: bool = True) -> "HalfWeight":
        return HalfWeight(tensors["weight"], stable)

    def dequantize(self) -> torch.Tensor:
        return self.weight.to(torch.float32)

    def linear(self, x: torch.Tensor, bias: torch.Tensor | None = None, native: bool = True) -> torch.Tensor:
        if x.is_cuda:
            from .host_gemm import host_gemm
            return host_gemm(x, self.weight, bias)
        ops = self.native_ops() if native else None
        if ops is not None and x.dtype == torch.float32 and 0 < x.numel() <= NATIVE_F16_MAX_ROWS * self.shape[1] \
                and (bias is None or (bias.dtype == torch.float32 and bias.is_cpu)):
            return ops.f16_linear_checked(x, self.weight, bias)
        if x.dtype != torch.float32 or x.numel() == 0 or not fbgemm_fp16_available():
            return F.linear(x, self.weight.to(x.dtype), None if bias is None else bias.to(x.dtype))
        y = torch.ops.quantized.linear_dynamic_fp16(x.reshape(-1, self.shape[1]), self._fbgemm_form())
        if bias is not None:
            y = y + bias
        return y.reshape(*x.shape[:-1], self.shape[0])

    def native_ops(self):
        """The native CPU ops when they take this weight (a CPU tensor with unit column stride), else None."""
        if self._native is None:
            from .cpu_native import load_native_ops
            ops = load_native_ops() if self.weight.is_cpu and self.weight.stride(-1) == 1 else None
            self._native = ops if ops is not None else False
        return self._native or None

    def _fbgemm_form(self):
        if self._fbgemm is not None:
            return self._fbgemm
        packed = torch.ops.quantized.linear_prepack_fp16(self.weight, None)
        if self.stable:
            self._fbgemm = packed
        return packed

    def __repr__(self) -> str:
        return f"HalfWeight(shape={self.shape}, stable={self.stable}, nbytes={self.nbytes})"


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


def pack_int4(q: torch.Tensor) -> torch.Tensor:
    """uint8 ``[N, ceil(K/2)]`` from 4-bit codes ``[N, K]`` (even column in the low nibble)."""
    n, k = q.shape
    q = q.to(torch.uint8)
    if k % 2:
        q = torch.cat([q, q.new_zeros(n, 1)], dim=1)
    return (q[:, 0::2] | (q[:, 1::2] << 4)).contiguous()


def unpack_int4(packed: torch.Tensor, k: int) -> torch.Tensor:
    """uint8 codes ``[N, K]`` from the packed nibbles."""
    low, high = packed & 0xF, packed >> 4
    return torch.stack([low, high], dim=-1).reshape(packed.shape[0], -1)[:, :k]


def _grouped(w: torch.Tensor, group_size: int) -> torch.Tensor:
    n, k = w.shape
    groups = -(-k // group_size)
    pad = groups * group_size - k
    if pad:  # padding repeats the last column so it never widens a group's range
        w = torch.cat([w, w[:, -1:].expand(n, pad)], dim=1)
    return w.reshape(n, groups, group_size)


def quantize_int8(w: torch.Tensor, group_size: int | None = None, cpu_route: str = "exact") -> PackedWeight:
    """Symmetric int8, one scale per output channel (or per group of ``group_size`` columns)."""
    w = w.detach().to(torch.float32)
    n, k = w.shape
    group_size = group_size or k
    g = _grouped(w, group_size)
    scale = g.abs().amax(dim=-1).clamp(min=1e-12) / 127.0
    q = torch.round(g / scale[..., None]).clamp(-127, 127).reshape(n, -1)[:, :k].to(torch.int8)
    return PackedWeight("int8", q.contiguous(), scale.contiguous(), None, group_size, (n, k), cpu_route)


def quantize_int4(w: torch.Tensor, group_size: int = INT4_DEFAULT_GROUP) -> PackedWeight:
    """Asymmetric int4 per group: ``minimum`` is the group's minimum, ``scale`` its range / 15."""
    w = w.detach().to(torch.float32)
    n, k = w.shape
    g = _grouped(w, group_size)
    lo, hi = g.amin(dim=-1), g.amax(dim=-1)
    scale = ((hi - lo) / 15.0).clamp(min=1e-12)
    q = torch.round((g - lo[..., None]) / scale[..., None]).clamp(0, 15).reshape(n, -1)[:, :k]
    return PackedWeight("int4", pack_int4(q), scale.contiguous(), lo.contiguous(), group_size, (n, k))


def quantize_fp8(w: torch.Tensor) -> PackedWeight:
    """float8_e4m3fn with one float32 scale per output channel (the row's largest magnitude maps to 448)."""
    w = w.detach().to(torch.float32)
    n, k = w.shape
    scale = w.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / FP8_MAX
    q = (w / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return PackedWeight("fp8", q.contiguous(), scale.contiguous(), None, k, (n, k))


def fp8_from_checkpoint(weight: torch.Tensor, weight_scale: torch.Tensor) -> PackedWeight:
    """An FP8 checkpoint's ``weight`` (float8_e4m3fn ``[N, K]``) and ``weight_scale`` (one value, or one per
    output channel: ``[1]``, ``[]``, ``[N]`` or ``[N, 1]``) as a packed fp8 weight, without loss."""
    n, k = weight.shape
    scale = weight_scale.detach().to(torch.float32).reshape(-1)
    if weight.dtype != torch.float8_e4m3fn or scale.numel() not in (1, n):
        raise ValueError(f"an fp8 weight is float8_e4m3fn [N, K] with one scale or one per output channel; got "
                         f"{weight.dtype} {tuple(weight.shape)} with weight_scale {tuple(weight_scale.shape)}")
    scale = scale.expand(n).reshape(n, 1).contiguous()
    return PackedWeight("fp8", weight.contiguous(), scale, None, k, (n, k))


QUANT_BLOCK_ROWS = 256   # output rows per block of quantize_rows: a block's float32 temporaries stay in cache


def empty_packed(fmt: str, shape: tuple[int, int], device: torch.device | str = "meta") -> PackedWeight:
    """The ``PackedWeight`` that ``quantize_rows(w, fmt)`` makes of a ``shape`` weight, with uninitialised (by default
    storage-free) tensors: its layout, without quantizing anything."""
    n, k = shape
    group = INT4_DEFAULT_GROUP if fmt == "int4" else k
    groups = -(-k // group)
    scale = torch.empty(n, groups, dtype=torch.float32, device=device)
    if fmt == "int4":
        return PackedWeight(fmt, torch.empty(n, (k + 1) // 2, dtype=torch.uint8, device=device), scale,
                            torch.empty(n, groups, dtype=torch.float32, device=device), group, (n, k))
    codes = torch.int8 if fmt == "int8" else torch.float8_e4m3fn
    return PackedWeight(fmt, torch.empty(n, k, dtype=codes, device=device), scale, None, group, (n, k))


def quantize_rows(w: torch.Tensor, fmt: str, workers: int = 1, rows: int = QUANT_BLOCK_ROWS,
                  dtype: torch.dtype | None = None) -> PackedWeight:
    """``int8`` / ``int4`` / ``fp8`` of a dense ``[N, K]`` weight, quantized in blocks of ``rows`` output rows on
    ``workers`` threads (torch's ops release the GIL). Every row (and its groups) is quantized on its own, so the
    result is bit-identical to one call over the whole weight; blocks keep the temporaries in cache. ``dtype``:
    each block is first rounded to it (a checkpoint's tensor quantized as the model's dense copy of it would be)."""
    whole = {"int8": quantize_int8, "int4": quantize_int4, "fp8": quantize_fp8}[fmt]

    def quantize(block: torch.Tensor) -> PackedWeight:
        return whole(block if dtype is None else block.to(dtype))
    if workers <= 1 or w.shape[0] <= rows:     # one thread: one call (blocks alone measured no faster)
        return quantize(w)
    blocks = [w[i:i + rows] for i in range(0, w.shape[0], rows)]
    with ThreadPoolExecutor(min(workers, len(blocks))) as pool:
        parts = list(pool.map(quantize, blocks))
    first = parts[0]
    minimum = torch.cat([p.minimum for p in parts]) if first.minimum is not None else None
    return PackedWeight(fmt, torch.cat([p.qweight for p in parts]), torch.cat([p.scale for p in parts]), minimum,
                        first.group_size, tuple(w.shape))


def pack_weight(weight, fmt: str, workers: int = 1) -> torch.Tensor | PackedWeight:
    """The host-memory form of one linear weight for ``--host-weight-dtype``.

    ``weight`` is a dense ``[N, K]`` tensor (bf16/fp16/fp32) or a GGUF quantized tensor (any
    object with ``ggml_type``, ``data``/``raw`` and ``shape``, see ``gguf_blocks``). ``fmt``:
    ``auto`` keeps GGUF tensors in their own format (lossless) and dense tensors as bf16;
    ``fp32`` / ``bf16`` give a dense tensor of that dtype; ``fp16`` a ``HalfWeight``; ``int8`` / ``int4`` / ``fp8`` a
    ``PackedWeight``. A ``PackedWeight`` (e.g. an FP8 checkpoint's weight) is kept when ``fmt`` is ``auto``
    or its own format, else dequantized and converted. ``workers``: threads quantizing (``quantize_rows``).
    """
    from .gguf_blocks import from_gguf, is_gguf_tensor
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
