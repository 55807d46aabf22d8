"""Representative compile configurations of every kernel, for scripts/check_kernels.py.

A ``CompileSpec`` names one kernel at one shape/dtype: its Triton signature (``*bf16``, ``i32``,
``constexpr``...), constexpr values, warps, the arguments we promise are 16-divisible (pointers
from torch allocations, strides of rows padded to 16 elements) and the narrowest acceptable
widest global load (128 for kernels whose point is streaming weights).
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class CompileSpec:
    name: str
    label: str
    fn: object
    signature: dict
    constexprs: dict
    num_warps: int = 4
    aligned: tuple = ()
    min_load_bits: int = 0
    extra: dict = field(default_factory=dict)


def signature_of(fn, types: dict, constexprs: dict) -> dict:
    """Full signature: given types, ``constexpr`` for constexprs, and ``i32`` for anything else."""
    return {name: ("constexpr" if name in constexprs else types.get(name, "i32")) for name in fn.arg_names}


def all_specs() -> list[CompileSpec]:
    from . import (fused_moe, fused_rows, gemv, host_gemm, lora_sgmv, paged_attention, paged_attention_split, rmsnorm,
                   rope, rope_store_kv, silu_mul, store_kv)
    specs: list[CompileSpec] = []
    for module in (host_gemm, gemv, fused_rows, fused_moe, paged_attention, paged_attention_split, store_kv, rope_store_kv, rmsnorm,
                   rope, silu_mul, lora_sgmv):
        specs.extend(module.compile_specs())
    return specs
