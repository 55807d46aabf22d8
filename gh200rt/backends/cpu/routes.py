"""Which CPU compute route is fastest and accurate on this machine, decided once per engine.

Routes (docs/BENCHMARKS.md measures each against fp32, speed and perplexity):

* ``bf16``: bf16 weights and activations, linears through oneDNN over weights reordered once at
  start-up (``backends/cpu/prepack.py``). Chosen when the CPU has native bf16 dot products
  (AVX-512 BF16 or AMX) and this torch's oneDNN says it can use them. With the native CPU kernels on a CPU with
  AMX the resident linears take the native AMX kernel instead (``amx-bf16``: as fast, and a row's bits do not
  depend on the row count, so prompt steps need no row blocks), on one with AVX-512 BF16 and no AMX the same layout
  on AVX-512 BF16 dot products (``dot-bf16``). For a GGUF checkpoint with the native CPU
  kernels the resident linears also keep the file's blocks for single rows (``onednn-bf16+gguf``,
  ``amx-bf16+gguf``).
* ``fp16``: float32 activations, linear weights stored as fp16 (``HalfWeight``): fbgemm's fp16 GEMM, and
  the native fp16 linear for a decode step's few rows. Chosen on CPUs without native bf16 where fbgemm runs
  (x86 with AVX2). For a GGUF
  checkpoint with the native CPU kernels the resident linears also keep the file's Q4_0 / Q4_1 / Q8_0
  blocks, which a single row (one sequence decoding) multiplies instead (``fp16+gguf``,
  ``prepack.resident_linear_format``): a third of the bytes, the exact GGUF weights.
* ``fp32``: the exact reference (``--dtype float32`` always gives it): fp32 linears through oneDNN,
  resident weights reordered once at start-up where that gives the dense weights' bits (probed per
  model, ``prepack.resident_linear_format``), streamed and direct ones dense.

The CPU's flags come from ``platform/cpu_features.py``.

``--cpu-route`` forces a route instead of detecting one (``route_for``): any route this process can execute,
whatever the CPU would pick (tests and CI run every route this way, ``tests/cpu_routes.py``). A route that
cannot execute here is refused with the reason (``route_unavailable``), never swapped for another.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from gh200rt.config import CPU_ROUTES
from gh200rt.platform.cpu_features import cpu_flags, has_native_bf16

ROUTES = ("bf16", "fp16", "fp32")
assert set(CPU_ROUTES) == {"auto", *ROUTES}, CPU_ROUTES


@dataclass(frozen=True)
class CpuRoute:
    name: str                 # one of ROUTES
    dtype: torch.dtype        # compute dtype of activations (and of dense weights)
    linear_format: str | None  # "onednn-bf16", "onednn-fp32", "fp16", or None (dense weights as loaded)


_ROUTES = {
    "bf16": CpuRoute("bf16", torch.bfloat16, "onednn-bf16"),
    "fp16": CpuRoute("fp16", torch.float32, "fp16"),
    "fp32": CpuRoute("fp32", torch.float32, "onednn-fp32"),
}


def _onednn_bf16_ok() -> bool:
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def choose_route(flags: frozenset[str], onednn_bf16: bool, fbgemm_fp16: bool) -> CpuRoute:
    """The fastest accurate route for a CPU with ``flags`` (pure: tests pass made-up machines)."""
    if has_native_bf16(flags) and onednn_bf16:
        return _ROUTES["bf16"]
    if "avx2" in flags and fbgemm_fp16:
        return _ROUTES["fp16"]
    return _ROUTES["fp32"]


def route_unavailable(name: str) -> str | None:
    """Why this process cannot execute route ``name`` (None: it can). A route executes where the library its
    linears go through runs here, natively or emulated (oneDNN's bf16 on AVX-512 without BF16 is slow but
    exact to bf16); the CPU's fastest route is ``choose_route``'s business, not this."""
    if name not in ROUTES:
        return f"unknown CPU route {name!r}; choose one of {', '.join(ROUTES)}"
    if name == "bf16" and not _onednn_bf16_ok():
        return "this torch's oneDNN reports no bf16 support on this CPU (x86 needs AVX-512, Arm bf16 instructions)"
    if name == "fp16":
        from gh200rt.backends.cpu.half_linear import fbgemm_fp16_available
        if not fbgemm_fp16_available():
            return "this torch has no working fbgemm fp16 GEMM (fbgemm runs on x86 CPUs with AVX2)"
    return None


def routes_available() -> tuple[str, ...]:
    """The routes this process can execute (``--cpu-route`` values besides auto)."""
    return tuple(name for name in ROUTES if route_unavailable(name) is None)


def route_for(dtype_flag: str, cpu_route: str = "auto") -> CpuRoute:
    """The CPU route for ``--dtype`` and ``--cpu-route``: a forced route wins (``ModelConfig`` checks the two
    agree), else ``auto`` detects; float32 is the exact reference; bfloat16 uses the oneDNN route whenever
    oneDNN can (else plain bf16 linears); float16 keeps plain fp16 linears."""
    if cpu_route != "auto":
        why_not = route_unavailable(cpu_route)
        if why_not is not None:
            usable = ", ".join(routes_available())
            raise ValueError(f"--cpu-route {cpu_route}: {why_not}; this machine runs {usable} (or leave "
                             f"--cpu-route auto)")
        return _ROUTES[cpu_route]
    if dtype_flag == "auto":
        from gh200rt.backends.cpu.half_linear import fbgemm_fp16_available
        return choose_route(cpu_flags(), _onednn_bf16_ok(), fbgemm_fp16_available())
    if dtype_flag == "bfloat16":
        return _ROUTES["bf16"] if _onednn_bf16_ok() else CpuRoute("bf16", torch.bfloat16, None)
    if dtype_flag == "float16":
        return CpuRoute("fp16-acts", torch.float16, None)
    return _ROUTES["fp32"]


def describe(route: CpuRoute) -> str:
    flags = cpu_flags()
    shown = [f for f in ("amx_bf16", "avx512_bf16", "avx512f", "avx2") if f in flags]
    return f"CPU route {route.name} (compute {str(route.dtype).removeprefix('torch.')}; CPU flags: " \
           f"{', '.join(shown) or 'none of avx2/avx512'})"
