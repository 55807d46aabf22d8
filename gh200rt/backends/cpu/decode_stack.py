"""A decode step's decoder layers in one native call (``gh_decode_layers``, kernels/cpu/decode_layer.c), for the
native CPU ops.

The one-call layer (``decode_layer.py``) takes a layer's ~10 op calls to one, but at one sequence the Python around
each call — the layer's forward, the checks that its cached arguments still hold, an output tensor, the ctypes call,
the weight schedule's hooks — still cost ~65 us a layer on a first-generation Zen: 2 ms of a 16 ms SmolLM2 step.
Where every layer of the model takes the one-call path (``layer_call`` gives each an argument block) and the
step's weight hooks do nothing between layers (all weights where they stay: no staging ring to drive), the model
runner hands the whole stack here: one call runs ``gh_decode_layer`` on each layer in turn with exactly the
arguments the layer-by-layer path would give it, so the hidden states and the KV pool keep their bits
(tests/model/test_cpu_decode_stack.py).

The stack's argument array is cached on the model under a key of everything the layers' own keys read (row count,
threads, every ``WeightRef`` version, the norms' and biases' addresses, each layer's hooks and KV-scale
calibration) read flat in one pass, and the pools it was built for (held weakly); a step that changes any of them
rebuilds it through ``layer_call``.
"""
from __future__ import annotations

import ctypes
import weakref
from operator import attrgetter, itemgetter, methodcaller

import torch

from gh200rt.backends.cpu.decode_layer import activations_fit, layer_call, layer_parts, rows_fit, step_args
from gh200rt.backends.cpu.native_args import DecodeStepArgs
from gh200rt.backends.cpu.native_ops import NativeOps
from gh200rt.backends.interface import DECODE_STATE_PREFIX

_PROBES = DECODE_STATE_PREFIX + "native_stack_probes"   # the model's _StackProbes, in its __dict__
_STACK = DECODE_STATE_PREFIX + "native_stack"           # the model's cached _Stack

# the key is read every step: C-level getters over flat tuples (a module's parameter through nn.Module's
# __getattr__ costs a microsecond; its _parameters dict holds the same tensor)
_version = attrgetter("version")
_weight = itemgetter("weight")
_address = methodcaller("data_ptr")
_layer_fn = attrgetter("decode_layer_fn")
_attention_state = attrgetter("calculate_kv_scales", "decode_block_fn")


class _StackProbes:
    """What the stack's key reads, gathered once per model (``layers`` None: a layer never takes one call)."""
    __slots__ = ("layers", "attn", "attns", "refs", "norm_parameters", "bias")

    def __init__(self, model):
        layers = tuple(model.layers)
        self.layers = None
        if not layers or any(layer.sparse or layer.latent or layer.partial_rotary for layer in layers):
            return
        parts = [layer_parts(layer) for layer in layers]
        self.layers = layers
        self.attn = parts[0].attn
        self.attns = tuple(p.attn for p in parts)
        self.refs = tuple(ref for p in parts for ref in p.refs)
        self.norm_parameters = tuple(norm._parameters for p in parts for norm in p.norms)
        self.bias = tuple(b for p in parts for b in p.bias)     # as the layers' own keys read them

    def key(self, rows: int, dtype: torch.dtype, threads: int) -> tuple:
        return (rows, dtype, threads, *map(_version, self.refs), *map(_address, map(_weight, self.norm_parameters)),
                *map(_address, self.bias), *map(_layer_fn, self.layers), *map(_attention_state, self.attns))


class _Stack:
    """The argument blocks of every layer for one key and set of pools (``array`` None: some layer goes op by op)."""
    __slots__ = ("key", "pools", "calls", "array", "step", "host_layers")

    def __init__(self, key: tuple, calls: list | None, kv_caches: list[torch.Tensor]):
        self.key = key
        self.pools = tuple(weakref.ref(kv) for kv in kv_caches)
        self.calls = calls          # the layers' _LayerCall, which own the DecodeLayerArgs the array points at
        self.array = None if calls is None else \
            (ctypes.c_void_p * len(calls))(*(ctypes.addressof(c.args) for c in calls))
        self.step = DecodeStepArgs()
        self.host_layers = None     # the HostKVLayers every call's arguments point at (None: none)

    def holds(self, kv_caches: list[torch.Tensor]) -> bool:
        """Whether the arguments point at ``kv_caches`` (a layer's call also serves that layer alone, and may have
        been pointed at another pool since)."""
        if len(kv_caches) != len(self.pools):
            return False
        if self.calls is None:
            return all(p() is kv for p, kv in zip(self.pools, kv_caches))
        return all(c.pool is not None and c.pool() is kv for c, kv in zip(self.calls, kv_caches))


class NativeDecodeStack:
    """The model's ``decode_stack_fn`` under the native CPU ops: ``(model, hidden, cos, sin, meta, kv_caches)`` ->
    the last decoder layer's output (its residual added), or None where any layer would not take its one call
    (``layer_fn``: the native one-call layer that every layer's ``decode_layer_fn`` must be)."""

    def __init__(self, ops: NativeOps, layer_fn):
        self.ops, self.layer_fn = ops, layer_fn

    def __call__(self, model, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, meta,
                 kv_caches: list[torch.Tensor]) -> torch.Tensor | None:
        if meta.linear_rows is not None or not activations_fit(hidden):
            return None
        probes = model.__dict__.get(_PROBES)
        if probes is None:
            probes = model.__dict__[_PROBES] = _StackProbes(model)
        if probes.layers is None:
            return None
        rows, dtype = hidden.shape[0], hidden.dtype
        step = step_args(meta)
        if not rows_fit(probes.attn, rows, dtype, step, cos, sin):
            return None
        threads = torch.get_num_threads()
        key = probes.key(rows, dtype, threads)
        stack = model.__dict__.get(_STACK)
        if stack is None or stack.key != key or not stack.holds(kv_caches):
            stack = model.__dict__[_STACK] = _Stack(key, self._calls(probes, rows, dtype, threads, kv_caches),
                                                    kv_caches)
        if stack.array is None:
            return None
        if meta.host_kv is not stack.host_layers:
            for call, kv_cache in zip(stack.calls, kv_caches):
                call.point_host(meta, kv_cache)
            stack.host_layers = meta.host_kv
        args = stack.step
        args.cos, args.sin = cos.data_ptr(), sin.data_ptr()
        args.slots, args.block_tables, args.seq_lens = step.slots, step.tables, step.seq_lens
        args.table_stride = step.table_stride
        out = torch.empty_like(hidden)
        self.ops.decode_layers(hidden, stack.array, len(stack.calls), args, out)
        return out

    def _calls(self, probes: _StackProbes, rows: int, dtype: torch.dtype, threads: int,
               kv_caches: list[torch.Tensor]) -> list | None:
        if len(kv_caches) != len(probes.layers):
            return None
        calls = []
        for layer, kv_cache in zip(probes.layers, kv_caches):
            call = layer_call(layer, rows, dtype, threads, kv_cache) if layer.decode_layer_fn is self.layer_fn \
                else None
            if call is None:
                return None
            calls.append(call)
        return calls
