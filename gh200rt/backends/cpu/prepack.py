"""Resident CPU linear weights converted once, at start-up, into the form the CPU route multiplies fastest.

``cpu_route_form(weight, linear_format)`` is the form a resident dense weight takes for the route
chosen in ``backends/cpu/routes.py``; the weight store applies it to every resident linear
(decoder layers and the lm_head):

* ``onednn-bf16`` -> ``OneDNNWeight``: the bf16 weight reordered into oneDNN's blocked layout
  (``torch.ops.mkldnn._reorder_linear_weight``) and multiplied by oneDNN's inner product. At decode
  and prefill shapes it is faster than ``F.linear`` over the same bf16 tensor (which reorders the
  weight on every call) with the same arithmetic (bf16 products, fp32 accumulation; the tests
  compare the two).
* ``amx-bf16`` (the bf16 route on a CPU with AMX, native kernels on) -> ``AmxWeight`` (``amx_weight.py``): the bf16
  weight in the native AMX kernel's tile layout, as fast as oneDNN's and computing a row alike at every row count,
  so prompt steps need no row blocks. A weight whose K is not a multiple of 32 keeps the ``OneDNNWeight``.
* ``dot-bf16`` (the bf16 route on a CPU with AVX-512 BF16 and no AMX, native kernels on) -> ``Bf16DotWeight``: the
  same layout and contract on AVX-512 BF16 dot products (its bits its own).
* ``onednn-fp32`` -> ``OneDNNWeight`` over the float32 weight, for the exact fp32 route. oneDNN's
  inner product over the dense ``[N, K]`` tensor reorders the weight on every call above one row;
  the reordered copy saves that (SmolLM2-135M, one decode step on 2 AVX2 cores: ~54 -> ~32 ms at 2
  rows, docs/benchmarks/models.md). Streamed and direct layers keep computing from dense bytes, so
  this form is used only where it gives ``dense_linear``'s bits: on weights ``dense_linear`` sends to
  oneDNN, with the one-row rule of ``dense_linear``, and only after ``resident_linear_format`` found
  reordered == dense bit for bit for the model's shapes at start-up (DESIGN invariant 4).
* ``onednn-fp32+native`` (the fp32 route with the native CPU kernels) -> ``NativeRowsWeight``: up to
  ``backends.cpu.linear.NATIVE_F32_MAX_ROWS`` rows through the native float32 kernel over the dense weight,
  more through the reordered copy: the two routes ``native_dense_linear`` takes for a streamed or
  direct layer, so the bits agree. It holds both copies (twice the resident linear bytes).
* ``fp16`` -> ``HalfWeight`` (float32 activations: the native fp16 linear up to ``NATIVE_F16_MAX_ROWS`` rows,
  fbgemm's fp16 GEMM above).
* ``fp16+gguf`` (the fp16 route of a GGUF checkpoint, native kernels on) -> ``OneRowBlocksWeight``: a
  single row through the checkpoint's Q4_0 / Q4_1 / Q8_0 blocks and the native quantized linear, more
  rows through the ``HalfWeight``. A linear stored in another GGUF type keeps the plain fp16 form. On a CPU where
  a row through int4 codes widened to bytes is faster than through the nibbles (``int4_codes.widening_pays``, timed
  once at start-up), the Q4 blocks keep widened codes beside the nibbles, with the same bits.
* ``onednn-bf16+gguf`` (the bf16 route of a GGUF checkpoint, native kernels on) -> ``OneRowBlocksWeight``: a
  single row through the blocks (the bf16 row widened to float32, the product rounded back to bf16), more rows
  through the ``OneDNNWeight``: one sequence decoding reads a third of the bf16 bytes of a Q4 file. ``amx-bf16+gguf``
  is the same over an ``AmxWeight``.

Only resident weights are converted: a streamed layer's slot changes every step and a direct
layer's host slab is in the format ``--host-weight-dtype`` chose. The dense original is released
(the reordered copy replaces it), except a tied lm_head, whose tensor the embedding still reads.
"""
from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor

import torch

from gh200rt.backends.cpu import half_linear, int4_codes
from gh200rt.backends.cpu.amx_weight import AmxWeight, Bf16DotWeight, amx_fits, gated_rows
from gh200rt.backends.cpu.linear import native_rows
from gh200rt.formats.pack import pack_weight
from gh200rt.formats.packed_weight import concat_rows
from gh200rt.models.layers.dense import ONEDNN_MIN_ELEMENTS, onednn_available, onednn_linear, onednn_weight
from gh200rt.models.layers.linear import RefLinear

log = logging.getLogger(__name__)

# The row count oneDNN lays the float32 reordered weight out for. Measured on 2 shared AVX2 cores, SmolLM2-135M's
# 121 linears per pass (docs/benchmarks/models.md): at 2-8 rows every hint (None, 8, 32, 64) takes ~30-48 ms
# against ~54-67 ms dense, 32 and 64 ahead of None and 8 in the quieter run and all within noise in the
# other; at 256-2048-row prefill chunks all four are within noise of each other and of the dense weight per
# shape. 32 sits inside the decode batch range. Every hint gives the dense weight's bits at two rows and more.
FP32_REORDER_ROWS = 32
# Row counts the start-up probe compares reordered and dense at: decode batches (odd ones too) and a small
# prefill chunk; each shape once per process (SmolLM2-135M: ~1 s on 2 busy cores, most of it the lm_head).
PROBE_ROWS = (2, 3, 7, 33, 129)


class OneDNNWeight:
    """A bf16 or float32 ``[N, K]`` weight in oneDNN's reordered layout (satisfies the ``WeightRef`` contract).
    A float32 one multiplies under ``dense_linear``'s one-row rule, as dense float32 weights do."""
    __slots__ = ("packed", "shape", "dtype", "nbytes")

    def __init__(self, weight: torch.Tensor):
        assert weight.dtype in (torch.bfloat16, torch.float32) and weight.dim() == 2 and weight.device.type == "cpu"
        rows = FP32_REORDER_ROWS if weight.dtype == torch.float32 else None
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), rows)
        self.shape, self.dtype = tuple(weight.shape), weight.dtype
        self.nbytes = weight.nbytes  # the reordered copy holds the same values (plus block padding)

    def linear(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        if x.dtype != self.dtype:
            raise TypeError(f"this OneDNNWeight multiplies {self.dtype} activations, got {x.dtype}")
        if x.numel() == 0:
            return x.new_empty(*x.shape[:-1], self.shape[0])
        if self.dtype == torch.float32:
            return onednn_linear(x, self.packed, bias)
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, bias, "none", [], "")

    def __repr__(self) -> str:
        return f"OneDNNWeight(shape={self.shape})"


class OneRowBlocksWeight:
    """A resident linear with two forms of one weight: a single row (one sequence decoding) multiplies the
    checkpoint's own GGUF blocks through the native quantized linear (``kernels/cpu/quant_linear.c``: 4.5 or
    8.5 bits a weight read in place, the exact GGUF weights), more rows the route's batch form (``HalfWeight``:
    the native fp16 linear, fbgemm's GEMM above 8 rows), which the per-block integer sums do not beat from two
    rows on (docs/benchmarks/kernels.md).
    The choice depends on the row count alone, never on where the weight lives."""
    __slots__ = ("blocks", "batch", "shape")

    def __init__(self, blocks, batch):
        assert tuple(blocks.shape) == tuple(batch.shape), (blocks.shape, batch.shape)
        self.blocks, self.batch = blocks, batch
        self.shape = tuple(batch.shape)

    @property
    def nbytes(self) -> int:
        return int(self.blocks.nbytes) + int(self.batch.nbytes)

    def linear(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        if x.numel() != x.shape[-1]:
            return self.batch.linear(x, bias)
        if x.dtype == torch.float32:
            return self.blocks.linear(x, bias)
        # a bf16 row (the bf16 route) widened to float32 goes through the native quantized linear, which reads the
        # blocks in place (torch's bf16 int4 op would first build a reordered copy of them)
        return self.blocks.linear(x.float(), None if bias is None else bias.float()).to(x.dtype)

    def invariant_form(self):
        """The batch form where it computes every row alike at any row count (a step of prompt positions then
        multiplies all its rows there, one row too), else None."""
        form = getattr(self.batch, "invariant_form", None)
        return None if form is None else form()

    def silu_form(self, rows: int, block_rows: int | None):
        """The batch form's fused SiLU form for a call that ``linear`` (or ``RefLinear``'s blocks) sends there:
        not one row outside a prompt step, which the blocks multiply."""
        form = getattr(self.batch, "silu_form", None)
        if form is None or (rows == 1 and block_rows is None):
            return None
        return form(rows, block_rows)

    def __repr__(self) -> str:
        return f"OneRowBlocksWeight({self.blocks!r}, {self.batch!r})"


class NativeRowsWeight:
    """A resident float32 linear kept in two forms: its dense bytes for the native kernel (up to
    ``NATIVE_F32_MAX_ROWS`` rows: a decode step of a few sequences, streamed at close to the memory's
    speed) and oneDNN's reordered copy for more rows. ``native_dense_linear`` routes a streamed or direct
    layer's dense weight the same way by the same row count, and the reordered copy gives the dense bits
    (``reordered_matches_dense``), so placements agree bit for bit."""
    __slots__ = ("dense", "batch", "ops", "shape", "dtype")

    def __init__(self, dense: torch.Tensor, batch: OneDNNWeight, ops):
        assert dense.dtype == torch.float32 and tuple(dense.shape) == batch.shape, (dense.shape, batch.shape)
        self.dense, self.batch, self.ops = dense, batch, ops
        self.shape, self.dtype = batch.shape, dense.dtype

    @property
    def nbytes(self) -> int:
        return int(self.dense.nbytes) + int(self.batch.nbytes)

    def linear(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        if native_rows(x, self.dense, bias):
            return self.ops.f32_linear_checked(x, self.dense, bias)
        return self.batch.linear(x, bias)

    def __repr__(self) -> str:
        return f"NativeRowsWeight(shape={self.shape})"


def gguf_blocks_form(parts: list | None):
    """The GGUF blocks that make up one linear (``parts``: the loader's quantized tensors, in row order) as one
    ``PackedWeight`` the native quantized linear takes (int4 codes widened to bytes where that pays here), or None
    (no parts, another format, no native library)."""
    from gh200rt.backends.cpu.native import load_native_ops
    from gh200rt.backends.cpu.native_args import quant_linear_fits
    if not parts or any(not hasattr(p, "ggml_type") for p in parts) or load_native_ops() is None:
        return None
    try:
        packed = concat_rows([pack_weight(part, "auto") for part in parts])
    except ValueError:  # a GGUF type that has no packed form (Q4_K, F16...)
        return None
    if not quant_linear_fits(packed):
        return None
    if packed.fmt == "int4" and int4_codes.widening_pays():
        int4_codes.widen(packed)
    return packed


FP32_FORMATS = ("onednn-fp32", "onednn-fp32+native")
# The formats that keep a GGUF checkpoint's blocks for single rows beside a batch form: format -> batch format.
GGUF_ROW_FORMATS = {"fp16+gguf": "fp16", "onednn-bf16+gguf": "onednn-bf16", "amx-bf16+gguf": "amx-bf16",
                    "dot-bf16+gguf": "dot-bf16"}
TILED_FORMATS = {"amx-bf16": AmxWeight, "dot-bf16": Bf16DotWeight}   # the bf16 forms in the native tile layout


def gguf_blocks_bytes(parts: list | None) -> int:
    """Bytes ``gguf_blocks_form(parts)`` holds, from the parts' types and shapes (nothing is packed); 0 where it
    makes no blocks form."""
    from gh200rt.backends.cpu.native import load_native_ops
    from gh200rt.formats.gguf_blocks import GGML_Q8_0, packed_nbytes
    if not parts or any(not hasattr(p, "ggml_type") for p in parts) or load_native_ops() is None:
        return 0
    sizes = [packed_nbytes(p) for p in parts]
    if None in sizes or len({int(p.ggml_type) == GGML_Q8_0 for p in parts}) > 1:   # concat_rows: one format
        return 0
    if int(parts[0].ggml_type) != GGML_Q8_0 and int4_codes.widening_pays():
        sizes += [int4_codes.widened_bytes(*(int(d) for d in p.shape)) for p in parts]
    return sum(sizes)


def route_form_extra_bytes(weight, fmt: str | None, gguf_parts: list | None = None) -> int:
    """Bytes that ``fmt``'s resident form of ``weight`` holds beyond the weight's own (compute dtype) bytes: the
    fp32 formats' reordered copy beside the dense weight (for weights large enough for oneDNN), the ``fp16+gguf``
    format's GGUF blocks beside the fp16 forms (``gguf_parts``: the checkpoint's quantized tensors of this
    linear); 0 for the other formats, whose forms replace the dense weight with at most its bytes."""
    if not isinstance(weight, torch.Tensor):
        return 0
    if fmt in GGUF_ROW_FORMATS:
        return gguf_blocks_bytes(gguf_parts)
    if fmt not in FP32_FORMATS:
        return 0
    big = weight.dtype == torch.float32 and weight.dim() == 2 and weight.numel() >= ONEDNN_MIN_ELEMENTS
    return int(weight.nbytes) if big and onednn_available() else 0


def model_route_form_bytes(model, fmt: str | None, layers, lm_head: bool = True, parts_of=None,
                           refs_of=None) -> int:
    """``route_form_extra_bytes`` over the linears of ``layers`` (and the lm_head); ``parts_of(layer, name)``
    (``layer`` None: the lm_head) gives a linear's GGUF parts; ``refs_of(layer)`` the linears of a layer that
    count (default ``model.layer_weight_refs``: all of them)."""
    refs_of = refs_of or model.layer_weight_refs
    refs = [(layer, name, ref) for layer in layers for name, ref in refs_of(layer).items()]
    refs += [(None, "lm_head", model.lm_head.weight_ref)] if lm_head else []
    return sum(route_form_extra_bytes(ref.current, fmt, parts_of(layer, name) if parts_of else None)
               for layer, name, ref in refs)


def run_route_probes(fmt: str | None) -> None:
    """Run the once-a-process probes ``cpu_route_form(..., fmt)`` consults, on this thread: the store then makes
    a layer's forms on several threads at once, and one probe is timed (``int4_codes.widening_pays``) and sets
    torch's thread count while it runs."""
    from gh200rt.backends.cpu.native import load_native_ops
    if fmt is None:
        return
    onednn_available()
    if load_native_ops() is not None and fmt in GGUF_ROW_FORMATS:
        int4_codes.widening_pays()


def side_by_side(weights: dict, make_form, threads: int) -> dict:
    """``make_form(name, weight)`` for each of ``weights`` (``{name: weight}``), on up to ``threads`` threads, the
    largest weights first: oneDNN's reorder and fbgemm's fp16 packing run on one core each and release the GIL
    (``python -m gh200rt.bench kernel route-forms`` times it). Run ``run_route_probes`` first."""
    threads = min(len(weights), threads)
    if threads < 2:
        return {name: make_form(name, weight) for name, weight in weights.items()}
    largest_first = sorted(weights, key=lambda name: -getattr(weights[name], "nbytes", 0))
    with ThreadPoolExecutor(threads) as pool:
        forms = dict(zip(largest_first, pool.map(lambda name: make_form(name, weights[name]), largest_first)))
    return {name: forms[name] for name in weights}


def cpu_route_form(weight: torch.Tensor, fmt: str, gguf_parts: list | None = None, gated: bool = False,
                   threads: int = 1):
    """The resident form of ``weight`` for the route's ``fmt``; ``gguf_parts`` (the checkpoint's quantized
    tensors making up this linear, when it was a GGUF file) serve the ``fp16+gguf`` format's single rows;
    ``gated``: ``weight`` is a SiLU-gated MLP's ``[gate | up]`` (the ``amx-bf16`` form then fuses the SiLU);
    ``threads``: the fp16 forms' pieces are packed on up to that many."""
    if fmt in GGUF_ROW_FORMATS:
        batch = cpu_route_form(weight, GGUF_ROW_FORMATS[fmt], gated=gated, threads=threads)
        blocks = gguf_blocks_form(gguf_parts)
        return OneRowBlocksWeight(blocks, batch) if blocks is not None and not isinstance(batch, torch.Tensor) \
            else batch
    if fmt == "onednn-bf16":
        return OneDNNWeight(weight) if weight.dtype == torch.bfloat16 else weight
    if fmt in TILED_FORMATS:
        if amx_fits(weight):
            from gh200rt.backends.cpu.native import load_native_ops
            return TILED_FORMATS[fmt](weight, load_native_ops(), gated_rows(weight) if gated else 0)
        return cpu_route_form(weight, "onednn-bf16")
    if fmt == "onednn-fp32":  # only where dense_linear takes oneDNN: elsewhere F.linear's bits are the reference
        return OneDNNWeight(weight) if onednn_weight(weight) else weight
    if fmt == "onednn-fp32+native":
        from gh200rt.backends.cpu.native import load_native_ops
        ops = load_native_ops()
        assert ops is not None, "resident_linear_format picks onednn-fp32+native only with the native library"
        return NativeRowsWeight(weight, OneDNNWeight(weight), ops) if onednn_weight(weight) else weight
    if fmt == "fp16":
        try:
            half = pack_weight(weight, "fp16")
        except ValueError:  # beyond fp16's range: this weight stays dense
            return weight
        half_linear.fbgemm_form(half, threads)  # build fbgemm's packed copy now, not inside the first request
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


_probed: dict[tuple[int, int, bool], bool] = {}  # (N, K, bias) -> reordered == dense, once per process


def reordered_matches_dense(n: int, k: int, with_bias: bool) -> bool:
    """Whether a reordered float32 ``[n, k]`` weight gives the dense weight's bits at every ``PROBE_ROWS`` count
    (random weight and inputs of that shape; one-row inputs follow the rule that makes them two rows)."""
    key = (n, k, with_bias)
    if key not in _probed:
        gen = torch.Generator().manual_seed(n * 7919 + k)
        weight = torch.randn(n, k, generator=gen)
        bias = torch.randn(n, generator=gen) if with_bias else None
        with torch.inference_mode():
            packed = OneDNNWeight(weight)
            _probed[key] = all(torch.equal(packed.linear(x, bias), onednn_linear(x, weight, bias))
                               for x in (torch.randn(rows, k, generator=gen) for rows in PROBE_ROWS))
    return _probed[key]


def resident_linear_format(model, fmt: str | None, quantized: dict | None = None,
                           native_kernels: bool = True) -> str | None:
    """The form the weight store gives ``model``'s resident linears: ``fmt`` (the CPU route's
    ``linear_format``), except that ``onednn-fp32`` falls back to dense weights (None), with a log line
    saying why, unless reordered weights give the dense bits for every shape the model reorders, and becomes
    ``onednn-fp32+native`` with the native CPU kernels (``NativeRowsWeight``); and that the fp16 route of a
    GGUF checkpoint (``quantized`` holds its blocks) with the native CPU kernels becomes ``fp16+gguf``, and the
    bf16 route's ``onednn-bf16+gguf``: single rows through the blocks (``OneRowBlocksWeight``); and that the bf16
    route on a CPU with AMX (native kernels on) becomes ``amx-bf16`` (``amx-bf16+gguf``), on one with AVX-512 BF16 and
    no AMX ``dot-bf16`` (``dot-bf16+gguf``)."""
    if fmt == "onednn-bf16" and native_kernels:
        fmt = "amx-bf16" if amx_available() else "dot-bf16" if bf16_dot_available() else fmt
    if fmt in ("fp16", "onednn-bf16", *TILED_FORMATS) and native_kernels and quantized and \
            any(hasattr(q, "ggml_type") for q in quantized.values()):
        from gh200rt.backends.cpu.native import load_native_ops
        return f"{fmt}+gguf" if load_native_ops() is not None else fmt
    if fmt != "onednn-fp32":
        return fmt
    shapes = sorted({(*m.weight_ref.shape, m.bias is not None) for m in model.modules()
                     if isinstance(m, RefLinear) and isinstance(m.weight_ref.current, torch.Tensor)
                     and onednn_weight(m.weight_ref.current)})
    differing = [shape for shape in shapes if not reordered_matches_dense(*shape)]
    if differing:
        log.warning("fp32 route: resident linears keep dense weights; oneDNN's reordered weights do not give the "
                    "dense weights' bits for (N, K, bias) %s, and streamed or direct layers must match resident "
                    "ones bit for bit", differing)
        return None
    if native_kernels:
        from gh200rt.backends.cpu.native import load_native_ops
        return "onednn-fp32+native" if load_native_ops() is not None else fmt
    return fmt


def amx_available() -> bool:
    """Whether the native library runs AMX bf16 tiles here (built for this CPU, and the OS grants the tile state)."""
    from gh200rt.backends.cpu.native import load_native_ops
    ops = load_native_ops()
    return ops is not None and ops.amx_available()


def bf16_dot_available() -> bool:
    """Whether the native library runs the AVX-512 BF16 dot-product linear here (built for a CPU with AVX-512 BF16)."""
    from gh200rt.backends.cpu.native import load_native_ops
    ops = load_native_ops()
    return ops is not None and ops.bf16_dot_available()
