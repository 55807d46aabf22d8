"""Native CPU ops inside the model, through the layers' swap hooks (the CPU counterpart of backends/cuda/ops.py).

``use_native_cpu_kernels(model) -> str | None`` points RMSNorm, RoPE, the KV store, decode attention,
the attention of prompt chunks up to ``EXTEND_MAX_KEYS`` keys and SiLU-and-mul at the native ops of
``kernels/cpu`` (layer_ops.c, kv_store.c, decode_attention.c and extend_attention.c; a decode-only step's
RoPE, KV store and attention in one call per layer, ``decode_block``) and float32 linears of a few rows at the
native kernel (``native_linear.native_dense_linear``), gives a decode step's decoder layers one call each where every
op of the layer is native (``decode_layer.native_decode_layer``) and the whole stack one call where every layer takes
its one call (``decode_stack.NativeDecodeStack``), and returns None, or leaves the torch
ops in place and returns why (no C compiler, not a CPU model). At decode sizes each torch op costs
more in dispatch than in arithmetic: one layer's ~36 small ops take about a millisecond on a 2-core
host, the native ops a fraction of that (docs/benchmarks/models.md).

Each adapter takes what the layer passes and returns what the torch op returns; inputs the native
code does not cover (a dtype other than float32/bfloat16, multi-token attention groups with longer
contexts) go to the torch op; an fp8 pool is written and read with the layer's scales. The same ops
serve every tier and the bucketed decode path, so placements stay bit-identical to each other (DESIGN
invariant 4); against the torch ops rotary and the KV store (an fp8 one too) are bit-identical and the
reductions (RMSNorm, SiLU's exp, attention's softmax) agree to float32 rounding
(tests/kernels/test_cpu_native.py).
"""
from __future__ import annotations

import functools

import torch

from gh200rt.backends.cpu import linear as native_linear
from gh200rt.backends.cpu.decode_layer import native_decode_layer
from gh200rt.backends.cpu.decode_stack import NativeDecodeStack
from gh200rt.backends.cpu.native import load_native_ops, native_ops_error
from gh200rt.backends.cpu.native_checks import DTYPES, FP8_KV_TYPES
from gh200rt.backends.cpu.native_ops import NativeOps
from gh200rt.backends.interface import TORCH_OPS, switch_hooks
from gh200rt.kv import attention as torch_attention
from gh200rt.kv.host_blocks import host_view
from gh200rt.models.layers import activation, rmsnorm, rotary

# Multi-token sequences of at most this many keys take the native kernel; longer ones keep SDPA (a group of their
# own, so a short prompt's bits never depend on a long one beside it). Its tiles re-read K and V per work item,
# which stays in cache for short contexts (2-3x faster than SDPA at prompts of ~100 tokens, 1.6x at 512) and
# evens out at ~2k keys (docs/benchmarks/kernels.md). SDPA's sums depend on how a prompt was split, so a prompt
# longer than this is not prefix-cache invariant unless ``long_prompts_native`` (``--batch-invariant``).
EXTEND_MAX_KEYS = 2048


def native_cpu_ops(ops: NativeOps, long_prompts_native: bool = False) -> dict:
    """The hook table of the native ops; ``long_prompts_native``: multi-token attention past ``EXTEND_MAX_KEYS``
    keys on the native kernel too (every query by one kernel's arithmetic; slower than SDPA there)."""
    def max_keys() -> int | None:
        return None if long_prompts_native else EXTEND_MAX_KEYS

    def norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        if x.dtype not in DTYPES or weight.dtype != x.dtype:
            return rmsnorm.rms_norm(x, weight, eps)
        return ops.rms_norm(x, weight, eps)

    def act(gate_up: torch.Tensor) -> torch.Tensor:
        if gate_up.dtype not in DTYPES:
            return activation.silu_and_mul(gate_up)
        return ops.silu_mul(gate_up)
    act.native_silu_mul = True   # GatedMLP may fuse it into the gate/up product (AmxWeight.silu_linear: its bits)

    def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        if x.dtype not in DTYPES or cos.dtype != x.dtype:
            return rotary.apply_rotary(x, cos, sin)
        return ops.rotary(x, cos, sin)

    def write_kv(kv_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor,
                 kv_scale: torch.Tensor | None = None) -> None:
        if k.dtype not in DTYPES or (kv_cache.dtype not in DTYPES and kv_cache.dtype not in FP8_KV_TYPES):
            return torch_attention.write_kv(kv_cache, k, v, slot_mapping, kv_scale)
        ops.write_kv(kv_cache, k, v, slot_mapping, kv_scale)

    def attention(q: torch.Tensor, kv_cache: torch.Tensor, meta, scale: float, num_kv_heads: int,
                  kv_scale: torch.Tensor | None = None) -> torch.Tensor:
        if q.dtype not in DTYPES or (kv_cache.dtype != q.dtype and kv_cache.dtype not in FP8_KV_TYPES):
            return torch_attention.paged_attention(q, kv_cache, meta, scale, num_kv_heads, kv_scale)
        return torch_attention.paged_attention(q, kv_cache, meta, scale, num_kv_heads, kv_scale,
                                               ops.decode_attention, extend, max_keys())

    def extend(q: torch.Tensor, kv_cache: torch.Tensor, block_tables: torch.Tensor, seq_lens: torch.Tensor,
               query_starts: torch.Tensor, scale: float, kv_scale: torch.Tensor | None = None,
               host=None) -> torch.Tensor | None:
        limit = max_keys()
        if limit is not None and int(seq_lens.max()) > limit:
            return None
        return ops.extend_attention(q, kv_cache, block_tables, seq_lens, query_starts, scale, kv_scale, host)

    def decode_block(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv_cache: torch.Tensor, meta,
                     scale: float, heads: int, kv_heads: int, kv_scale: torch.Tensor | None = None,
                     qk_norm=None) -> torch.Tensor | None:
        if qk_norm is not None:
            return None
        layout = torch_attention.batch_layout(meta)
        if not (layout.single and layout.groups[0].decode) or qkv.dtype not in DTYPES or cos.dtype != qkv.dtype \
                or (kv_cache.dtype != qkv.dtype and kv_cache.dtype not in FP8_KV_TYPES):
            return None
        group = layout.groups[0]
        return ops.decode_attention_block(qkv, cos, sin, kv_cache, meta.slot_mapping, group.table, group.seq_lens,
                                          scale, heads, kv_heads, kv_scale, host_view(meta, kv_cache))

    decode_layer = native_decode_layer(ops)
    return dict(rotary=lambda: rope, write_kv=write_kv, attention=attention, norm=norm, act=act,
                latent_attention=(rope, write_kv, attention), decode_block=decode_block,
                dense_linear=native_linear.native_dense_linear(ops), decode_layer=decode_layer,
                decode_stack=NativeDecodeStack(ops, decode_layer))


@functools.lru_cache(maxsize=2)
def _native_ops_table(long_prompts_native: bool) -> dict | None:
    ops = load_native_ops()
    return None if ops is None else native_cpu_ops(ops, long_prompts_native)


def use_native_cpu_kernels(model: torch.nn.Module, long_prompts_native: bool = False) -> str | None:
    """Switch ``model``'s hooks to the native CPU ops; returns None, or why the torch ops stay."""
    if any(p.device.type != "cpu" for p in model.parameters()):
        return "the model is not on the CPU"
    table = _native_ops_table(long_prompts_native)
    if table is None:
        return native_ops_error()
    switch_hooks(model, table)
    return None


def use_torch_cpu_kernels(model: torch.nn.Module) -> None:
    switch_hooks(model, TORCH_OPS)
