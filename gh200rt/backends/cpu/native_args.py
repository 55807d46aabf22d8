"""The argument blocks the native linears read (``kernels/cpu/quant_linear.c``, ``decode_layer.c``) as ctypes
structures, which weights the native quantized linear takes, and how many threads a native linear runs on.

A packed weight's ``QuantWeight`` is built once and kept on the weight (``quant_weight_args``); the one-call decode
layer (gh200rt/backends/cpu/decode_layer.py) fills a ``DecodeLayerArgs`` of four ``LinearArgs``.
"""
from __future__ import annotations

import ctypes

import torch

_P, _I, _F = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float

# below this many weights a quantized linear runs on one thread: waking a second costs more than it saves
SHARED_WEIGHT_ELEMENTS = 1 << 17
CHUNK_COLUMNS = 32   # quant_linear.c's CHUNK: the columns of one rounded block of activations


class WeightArgs(ctypes.Structure):
    """quant_linear.c's WeightArgs."""
    _fields_ = [("q", ctypes.c_void_p), ("scale", ctypes.c_void_p), ("minimum", ctypes.c_void_p),
                ("fmt", ctypes.c_int64), ("n", ctypes.c_int64), ("k", ctypes.c_int64), ("group", ctypes.c_int64)]


class QuantWeight:
    """The argument block of one packed weight, built once: its storage's addresses never change (a staging
    slot's contents do, which the kernel reads afresh on every call)."""
    __slots__ = ("args", "pointer")

    def __init__(self, weight):
        if not quant_linear_fits(weight):
            raise ValueError(f"the native quantized linear takes int8 / int4 CPU weights with groups of a multiple "
                             f"of 32 columns that divide K, got {weight!r}")
        n, k = weight.shape
        minimum = weight.minimum.data_ptr() if weight.minimum is not None else None
        self.args = WeightArgs(weight.qweight.data_ptr(), weight.scale.data_ptr(), minimum,
                                0 if weight.fmt == "int8" else 1, n, k, weight.group_size)
        self.pointer = ctypes.addressof(self.args)


class LinearArgs(ctypes.Structure):
    """gh_decode_layer.h's LinearArgs: one linear as the layer-by-layer path would call it."""
    _fields_ = [("kind", _I), ("w", _P), ("w_stride", _I), ("packed", _P), ("bias", _P), ("n", _I), ("k", _I),
                ("threads", _I), ("gated_inter", _I)]


LINEAR_F32, LINEAR_QUANT, LINEAR_F16, LINEAR_AMX, LINEAR_BF16_DOT = 0, 1, 2, 3, 4


class HostKV(ctypes.Structure):
    """gh_native.h's HostKV: the host KV blocks a layer's block tables may name, read in place (first 0: none)."""
    _fields_ = [("first", _I), ("k", _P), ("v", _P), ("block_stride", _I)]


def host_kv_args(view, kv_cache: torch.Tensor, out: HostKV | None = None) -> HostKV | None:
    """``view`` (a ``kv.host_blocks.HostBlocksView`` of ``kv_cache``'s layer, or None) as the native attention reads
    it, written into ``out`` where given (None for no view, or ``out`` cleared)."""
    if view is None:
        if out is not None:
            out.first = 0
        return None
    pool = view.pool
    assert pool.dtype == kv_cache.dtype and pool.is_cpu and pool.shape[2:] == kv_cache.shape[2:] \
        and pool.stride()[2:] == kv_cache.stride()[2:], "host blocks are laid out as the pool's, slot by slot"
    out = out if out is not None else HostKV()
    out.first, out.block_stride = view.first_id, pool.stride(1)
    out.k = pool.data_ptr()
    out.v = pool.data_ptr() + pool.stride(0) * pool.element_size()
    return out


def host_pointer(args: HostKV | None) -> int | None:
    """The address a native attention entry point takes for ``args`` (NULL for None); the caller keeps ``args``
    alive until the call returns."""
    return None if args is None else ctypes.addressof(args)


class DecodeLayerArgs(ctypes.Structure):
    """gh_decode_layer.h's DecodeLayerArgs."""
    _fields_ = [("qkv", LinearArgs), ("o", LinearArgs), ("gate_up", LinearArgs), ("down", LinearArgs),
                ("norm1", _P), ("norm2", _P), ("eps", _F), ("scale", _F), ("cos", _P), ("sin", _P),
                ("k_cache", _P), ("v_cache", _P), ("block_stride", _I), ("slot_stride", _I), ("head_stride", _I),
                ("block_size", _I), ("slots", _P), ("block_tables", _P), ("table_stride", _I), ("seq_lens", _P),
                ("heads", _I), ("kv_heads", _I), ("head_dim", _I), ("hidden", _I), ("inter", _I), ("threads", _I),
                ("kv_type", _I), ("kv_scale", _P), ("dtype", _I), ("host", HostKV), ("fused_silu", _I)]


class DecodeStepArgs(ctypes.Structure):
    """gh_decode_layer.h's DecodeStepArgs: a decode step's fields of every layer's DecodeLayerArgs."""
    _fields_ = [("cos", _P), ("sin", _P), ("slots", _P), ("block_tables", _P), ("table_stride", _I),
                ("seq_lens", _P)]


def linear_threads(n: int, k: int) -> int:
    """The threads a native linear of ``[n, k]`` weights runs on: one below ``SHARED_WEIGHT_ELEMENTS``."""
    return torch.get_num_threads() if n * k >= SHARED_WEIGHT_ELEMENTS else 1


def quant_weight_args(weight) -> QuantWeight:
    """``weight``'s cached ``QuantWeight`` (kept on the weight, whose tensors it points into)."""
    args = weight.derived.get("native_args")
    if args is None:
        args = QuantWeight(weight)
        weight.derived["native_args"] = args
    return args


def quant_linear_fits(weight) -> bool:
    """Whether the native quantized linear takes this ``PackedWeight``: int8 or int4 on the CPU, contiguous
    storage, groups of a multiple of 32 columns that divide K."""
    n, k = weight.shape
    tensors = weight.tensors().values()
    return (weight.fmt in ("int8", "int4") and weight.group_size % 32 == 0 and k % weight.group_size == 0
            and all(t.is_cpu and t.is_contiguous() for t in tensors))
