"""A decoder layer of a decode step in one native call (``kernels/cpu/decode_layer.c``), for the native CPU ops.

At one sequence a SmolLM2 layer's arithmetic takes ~0.25 ms on 2 cores and its ~10 op calls cost more in
Python than that (module calls, adapters, argument checks, output tensors): the step was ~60% Python. With
the native CPU kernels on, ``DecoderLayer.decode_layer_fn`` is ``native_decode_layer(ops)``: for a
decode-only step it works out what each of the layer's ops would call — which native linear each of the four
linears' current weights takes at this row count, the KV pool, the step's slots and block tables — and
makes one call that runs exactly those entry points with exactly those arguments, so the output has the
layer-by-layer path's bits (tests/model/test_cpu_decode_layer.py), and every tier still agrees (DESIGN
invariant 4). Where any op would go elsewhere (an MoE layer, a prefill or mixed step, an fbgemm or oneDNN
linear at this row count, fp8 weights, per-head q/k norms, a KV-scale calibration, a LoRA linear) it returns None
and the layer runs op by op. bfloat16 activations (the bf16 route) take the one call where every linear is
native at that row count: one sequence decoding a GGUF checkpoint's blocks (``OneRowBlocksWeight``), each linear's
row widened to float32 and its output rounded back, as the op-by-op path does; or bf16 weights in tiles
(``AmxWeight``, ``Bf16DotWeight``) at any row count, the bf16 rows passed as ``NativeOps._tiled_linear`` passes
them and the gate/up product's SiLU fused where the MLP fuses it (``MLP.fused_silu``): at 64 sequences the step's
~240 op calls through Python kept the second core idle for a fifth of the step.

What a layer's linears resolve to is cached on the layer, keyed by the row count, the thread count, each
WeightRef's ``version`` (it changes whenever a placement repoints the ref: a streamed layer's weight is a new
object each time its layer moves through the staging ring) and the data pointers of the norms and bias. The
cache holds no weight and no pool alive (a closed engine's host slabs unmap at once): the versions say when
its pointers are stale, and the pool is held by a weak reference.
"""
from __future__ import annotations

import weakref

import torch

from gh200rt.backends.cpu import half_linear, native_args, packed_linear
from gh200rt.backends.cpu.amx_weight import AmxWeight, Bf16DotWeight
from gh200rt.backends.cpu.half_linear import NATIVE_F16_MAX_ROWS
from gh200rt.backends.cpu.linear import native_rows_weight
from gh200rt.backends.cpu.native_args import (LINEAR_AMX, LINEAR_BF16_DOT, LINEAR_F16, LINEAR_F32, LINEAR_QUANT,
                                              DecodeLayerArgs, LinearArgs, host_kv_args)
from gh200rt.backends.cpu.native_checks import FP8_KV_TYPES
from gh200rt.backends.cpu.native_ops import NativeOps
from gh200rt.backends.cpu.packed_linear import NATIVE_MAX_ROWS
from gh200rt.backends.cpu.prepack import NativeRowsWeight, OneRowBlocksWeight
from gh200rt.backends.interface import DECODE_STATE_PREFIX
from gh200rt.formats.pack import HalfWeight, PackedWeight
from gh200rt.kv.host_blocks import host_view

_CACHE = DECODE_STATE_PREFIX + "native_call"   # the layer's cached _LayerCall, in its __dict__
_PARTS = DECODE_STATE_PREFIX + "native_parts"  # the layer's _LayerParts
_STEP = "_native_decode_step"     # the step's decode arguments, in the AttentionMetadata's __dict__


def linear_args(linear, rows: int, dtype: torch.dtype = torch.float32,
                widened: list | None = None) -> LinearArgs | None:
    """The native call ``linear`` makes for ``rows`` rows of ``dtype`` activations now (bfloat16: the float32 call
    on them widened, its bias too: the float32 copy is appended to ``widened``, which the caller keeps alive), or
    None where it would call elsewhere."""
    weight, bias = linear.weight_ref.current, linear.bias
    if linear.lora is not None:           # a LoRA linear adds its adapters' deltas in RefLinear.forward
        return None
    if bias is not None and (bias.dtype != dtype or not bias.is_cpu or not bias.is_contiguous()):
        return None
    if isinstance(weight, OneRowBlocksWeight) and rows > 1:
        weight = weight.batch             # what OneRowBlocksWeight.linear multiplies more rows with
    if isinstance(weight, AmxWeight):     # bf16 rows in tiles (AMX or AVX-512 BF16), at any row count
        return tiled_args(weight, bias, widened) if dtype == torch.bfloat16 else None
    if dtype != torch.float32:            # only a GGUF row form widens a bf16 row to the native quantized linear
        if not (isinstance(weight, OneRowBlocksWeight) and rows == 1 and dtype == torch.bfloat16):
            return None
        if bias is not None:              # OneRowBlocksWeight adds bias.float() to the float32 product
            bias = bias.float()
            if widened is None:
                return None
            widened.append(bias)
        return linear_args_of(linear, weight.blocks, rows, bias)
    if isinstance(weight, OneRowBlocksWeight):
        weight = weight.blocks if rows == 1 else weight.batch
    return linear_args_of(linear, weight, rows, bias)


def tiled_args(weight: AmxWeight, bias: torch.Tensor | None, widened: list | None) -> LinearArgs | None:
    """The call ``NativeOps._tiled_linear`` makes for ``weight`` (``AmxWeight.linear``: its bias in float32, a copy
    appended to ``widened``)."""
    if bias is not None:
        if widened is None:
            return None
        bias = bias.float().contiguous()
        widened.append(bias)
    n, k = weight.shape
    kind = LINEAR_BF16_DOT if isinstance(weight, Bf16DotWeight) else LINEAR_AMX
    return LinearArgs(kind, weight.packed.data_ptr(), 0, None, None if bias is None else bias.data_ptr(), n, k,
                      native_args.linear_threads(n, k), weight.gated_inter)


def linear_args_of(linear, weight, rows: int, bias: torch.Tensor | None) -> LinearArgs | None:
    """``linear_args`` for ``weight``, the form ``linear``'s current weight multiplies ``rows`` rows with, and its
    float32 ``bias``."""
    if isinstance(weight, HalfWeight):
        if not (linear.packed_native and rows <= NATIVE_F16_MAX_ROWS and half_linear.native_ops(weight) is not None):
            return None
        n, k = weight.shape
        return LinearArgs(LINEAR_F16, weight.weight.data_ptr(), weight.weight.stride(0), None,
                          None if bias is None else bias.data_ptr(), n, k, native_args.linear_threads(n, k))
    if isinstance(weight, NativeRowsWeight):
        weight = weight.dense
    elif isinstance(weight, torch.Tensor):
        if getattr(linear.dense_fn, "native_ops", None) is None:
            return None
    if isinstance(weight, torch.Tensor):
        if not native_rows_weight(rows, weight.shape[-1], weight, bias):
            return None
        n, k = weight.shape
        return LinearArgs(LINEAR_F32, weight.data_ptr(), weight.stride(0), None,
                          None if bias is None else bias.data_ptr(), n, k, native_args.linear_threads(n, k))
    if isinstance(weight, PackedWeight) and rows <= NATIVE_MAX_ROWS and packed_linear.native_ops(weight) is not None:
        n, k = weight.shape
        return LinearArgs(LINEAR_QUANT, None, 0, native_args.quant_weight_args(weight).pointer,
                          None if bias is None else bias.data_ptr(), n, k, native_args.linear_threads(n, k))
    return None


class _LayerParts:
    """What a layer's one-call path reads, looked up once (nn.Module attribute lookups are slow)."""
    __slots__ = ("attn", "mlp", "linears", "refs", "norms", "bias")

    def __init__(self, layer):
        self.attn = attn = layer.self_attn
        self.mlp = layer.mlp
        self.linears = (attn.qkv_proj, attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj)
        self.refs = tuple(m.weight_ref for m in self.linears)
        self.norms = (layer.input_layernorm, layer.post_attention_layernorm)
        self.bias = tuple(m.bias for m in self.linears if m.bias is not None)

    def key(self, rows: int, threads: int) -> tuple:
        return (rows, threads, *(ref.version for ref in self.refs), *(n.weight.data_ptr() for n in self.norms),
                *(b.data_ptr() for b in self.bias))


class _LayerCall:
    """One layer's argument block for a row count and set of weights (``args`` None: not native)."""
    __slots__ = ("parts", "key", "args", "pool", "dtype", "widened", "host_layers")

    def __init__(self, parts: _LayerParts, key: tuple, rows: int, threads: int, dtype: torch.dtype):
        self.parts, self.key, self.pool, self.dtype = parts, key, None, dtype
        self.host_layers = None     # the HostKVLayers args.host was pointed at (None: no host blocks)
        self.widened: list[torch.Tensor] = []    # float32 copies of a bf16 layer's biases, which args point at
        attn = parts.attn
        linears = [linear_args(m, rows, dtype, self.widened) for m in parts.linears]
        norms = tuple(n.weight for n in parts.norms)
        hidden = norms[0].shape[0]
        if any(a is None for a in linears) or any(w.dtype != dtype or not w.is_contiguous() or
                                                  w.shape != (hidden,) for w in norms) \
                or parts.norms[0].eps != parts.norms[1].eps:
            self.args = None
            return
        qkv, o, gate_up, down = linears
        width = (attn.num_heads + 2 * attn.num_kv_heads) * attn.head_dim
        assert (qkv.k, qkv.n, o.k, o.n, gate_up.k, gate_up.n, down.n) == \
            (hidden, width, attn.q_size, hidden, hidden, 2 * down.k, hidden), "the layer's linears do not chain"
        self.args = DecodeLayerArgs(*linears, norms[0].data_ptr(), norms[1].data_ptr(), parts.norms[0].eps,
                                    attn.scale, heads=attn.num_heads, kv_heads=attn.num_kv_heads,
                                    head_dim=attn.head_dim, hidden=hidden, inter=linears[3].k, threads=threads,
                                    dtype=int(dtype == torch.bfloat16))
        if gate_up.kind in (LINEAR_AMX, LINEAR_BF16_DOT) and parts.mlp.fused_silu(rows, None) is not None:
            assert gate_up.gated_inter == down.k, "a fused SiLU's gate/up weight is packed gated"
            self.args.fused_silu = 1

    def set_pool(self, kv_cache: torch.Tensor) -> bool:
        """Point the arguments at ``kv_cache`` (the activations' dtype or fp8 ``[2, blocks, block_size, kv_heads,
        head_dim]``, unit
        last stride: the layout ``gh_decode_attention_block`` indexes; an fp8 pool with the layer's ``kv_scale``,
        whose address is fixed); False for another pool."""
        args = self.args
        kv_type = 0 if kv_cache.dtype == self.dtype else FP8_KV_TYPES.get(kv_cache.dtype)
        if kv_type is None or not kv_cache.is_cpu or kv_cache.dim() != 5 \
                or kv_cache.shape[0] != 2 or kv_cache.shape[3] != args.kv_heads \
                or kv_cache.shape[4] != args.head_dim or kv_cache.stride(-1) != 1:
            return False
        strides = kv_cache.stride()
        args.k_cache = kv_cache.data_ptr()
        args.v_cache = kv_cache.data_ptr() + strides[0] * kv_cache.element_size()
        args.block_stride, args.slot_stride, args.head_stride = strides[1], strides[2], strides[3]
        args.block_size = kv_cache.shape[2]
        args.kv_type, args.kv_scale = kv_type, self.parts.attn.kv_scale.data_ptr() if kv_type else None
        self.pool = weakref.ref(kv_cache)
        host_kv_args(None, kv_cache, args.host)
        self.host_layers = None
        return True

    def point_host(self, meta, kv_cache: torch.Tensor) -> None:
        """Point the arguments at the host KV blocks ``meta``'s tables may name (``AttentionMetadata.host_kv``: one
        object for an engine's life, so this is an identity test per step), or at none."""
        layers = meta.host_kv
        if layers is not self.host_layers:
            host_kv_args(None if layers is None else host_view(meta, kv_cache), kv_cache, self.args.host)
            self.host_layers = layers


class StepArgs:
    """A decode-only step's slots, block tables and lengths as the native attention reads them."""
    __slots__ = ("rows", "keep", "slots", "tables", "table_stride", "seq_lens")

    def __init__(self, meta):
        self.rows = 0
        # a decode-only step is batch_layout's single decode group over the whole table (not built here: its
        # masks and gathers serve the torch attention, which a one-call layer never runs)
        if not meta.query_lens_list or not meta.is_decode_only:
            return
        slots = meta.slot_mapping.to(torch.int64).contiguous()
        tables = meta.block_tables.to(torch.int32).contiguous()
        seq_lens = meta.seq_lens.to(torch.int64).contiguous()
        if not (slots.is_cpu and tables.is_cpu and seq_lens.is_cpu) or tables.dim() != 2:
            return
        self.rows = meta.num_seqs
        self.keep = (slots, tables, seq_lens)
        self.slots, self.tables, self.seq_lens = slots.data_ptr(), tables.data_ptr(), seq_lens.data_ptr()
        self.table_stride = tables.stride(0)


def step_args(meta) -> StepArgs:
    """The decode arguments of ``meta``'s step (``rows`` 0: not a decode-only step on the CPU), built once per step."""
    step = meta.__dict__.get(_STEP)
    if step is None:
        step = meta.__dict__[_STEP] = StepArgs(meta)
    return step


def layer_parts(layer) -> _LayerParts:
    parts = layer.__dict__.get(_PARTS)
    if parts is None:
        parts = layer.__dict__[_PARTS] = _LayerParts(layer)
    return parts


def rows_fit(attn, rows: int, dtype: torch.dtype, step: StepArgs, cos: torch.Tensor, sin: torch.Tensor) -> bool:
    """Whether ``rows`` rows of ``dtype`` with these rotary tables are the one-call layer's: one per sequence of the
    step, and the tables laid out as the native attention reads them."""
    return step.rows == rows and rows > 0 and cos.dtype == dtype and sin.dtype == dtype \
        and cos.is_contiguous() and sin.is_contiguous() and cos.numel() == rows * (attn.head_dim // 2) \
        and sin.shape == cos.shape


def layer_call(layer, rows: int, dtype: torch.dtype, threads: int, kv_cache: torch.Tensor) -> _LayerCall | None:
    """``layer``'s argument block for a decode step of ``rows`` rows of ``dtype`` activations on ``threads``
    threads, pointed at ``kv_cache`` (cached on the layer while its weights and pool stay), or None where the layer
    runs op by op. Its step fields are not set."""
    if layer.sparse:   # an MoE layer's experts run op by op (models/moe.py)
        return None
    parts = layer_parts(layer)
    attn = parts.attn
    if attn.q_norm is not None or attn.calculate_kv_scales or attn.decode_block_fn is None:
        return None
    key = (dtype, *parts.key(rows, threads))
    call = layer.__dict__.get(_CACHE)
    if call is None or call.key != key:
        call = layer.__dict__[_CACHE] = _LayerCall(parts, key, rows, threads, dtype)
    if call.args is None or ((call.pool is None or call.pool() is not kv_cache) and not call.set_pool(kv_cache)):
        return None
    return call


def activations_fit(hidden: torch.Tensor) -> bool:
    return hidden.dtype in (torch.float32, torch.bfloat16) and hidden.is_cpu and hidden.is_contiguous() \
        and hidden.dim() == 2


def native_decode_layer(ops: NativeOps):
    """The ``DecoderLayer.decode_layer_fn`` of the native CPU ops (see the module docstring)."""
    def decode_layer(layer, hidden: torch.Tensor, residual: torch.Tensor | None, cos: torch.Tensor,
                     sin: torch.Tensor, meta, kv_cache: torch.Tensor) -> torch.Tensor | None:
        if layer.sparse or not activations_fit(hidden):
            return None
        rows, dtype = hidden.shape[0], hidden.dtype
        step = step_args(meta)
        if not rows_fit(layer_parts(layer).attn, rows, dtype, step, cos, sin):
            return None
        call = layer_call(layer, rows, dtype, torch.get_num_threads(), kv_cache)
        if call is None:
            return None
        call.point_host(meta, kv_cache)
        args = call.args
        args.cos, args.sin = cos.data_ptr(), sin.data_ptr()
        args.slots, args.block_tables, args.seq_lens = step.slots, step.tables, step.seq_lens
        args.table_stride = step.table_stride
        if residual is not None:   # the previous layer ran op by op and left its residual add to this one
            hidden = residual + hidden
        out = torch.empty_like(hidden)
        ops.decode_layer(hidden, args, out)
        return out
    return decode_layer
