"""The CPU's feature flags, read once: what the CPU backend's route choice (``backends/cpu/routes.py``) and the
native kernels' build look at.

Flags come from ``/proc/cpuinfo`` (x86 names: ``avx512_bf16``, ``amx_bf16``, ``avx2``; Arm's ``Features`` line); where
that file is missing, torch's CPU capability and oneDNN's bf16 probe stand in.
"""
from __future__ import annotations

import functools

import torch


def read_cpu_flags(path: str = "/proc/cpuinfo") -> frozenset[str] | None:
    """The first CPU's feature flags, or None when the file is unreadable or lists none."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                key, sep, value = line.partition(":")
                if sep and key.strip() in ("flags", "Features"):
                    return frozenset(value.split())
    except OSError:
        return None
    return None


def _torch_flags() -> frozenset[str]:
    """Flags inferred from torch when /proc/cpuinfo says nothing."""
    flags = set()
    capability = torch.backends.cpu.get_cpu_capability()
    if capability in ("AVX2", "AVX512"):
        flags.add("avx2")
    if capability == "AVX512" and torch.ops.mkldnn._is_mkldnn_bf16_supported():
        flags.add("avx512_bf16")
    return frozenset(flags)


@functools.lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    flags = read_cpu_flags()
    return flags if flags else _torch_flags()


def has_native_bf16(flags: frozenset[str]) -> bool:
    return "avx512_bf16" in flags or "amx_bf16" in flags
