"""Representative compile configurations of every kernel, for scripts/check_kernels.py.

A ``CompileSpec`` names one kernel at one shape/dtype: its Triton signature (``*bf16``, ``i32``,
``constexpr``...), constexpr values, warps, the arguments we promise are 16-divisible (pointers
from torch allocations, strides of rows padded to 16 elements) and the narrowest acceptable
widest global load (128 for kernels whose point is streaming weights).
"""
from __future__ import annotations

import importlib
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


# The modules whose ``compile_specs()`` scripts/check_kernels.py compiles, by name: imported when asked for, so
# this module (which every kernel module imports for CompileSpec) imports none of them.
KERNEL_MODULES = tuple(f"gh200rt.kernels.triton.{name}" for name in (
    "host_gemm", "gemv", "fused_rows", "fused_moe", "paged_attention", "paged_attention_split", "store_kv",
    "rope_store_kv", "rmsnorm", "rope", "silu_mul", "lora_sgmv", "mla_attention"))


def all_specs() -> list[CompileSpec]:
    specs: list[CompileSpec] = []
    for name in KERNEL_MODULES:
        specs.extend(importlib.import_module(name).compile_specs())
    return specs
