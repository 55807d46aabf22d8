"""Whether the test session runs Triton kernels in the interpreter or compiled.

The interpreter is for machines without a CUDA device (CI, laptops): there the Triton kernels are
checked against their torch references on the CPU. On a GPU host the ``gpu`` tests must judge the
compiled kernels, so the interpreter stays off. An explicit ``TRITON_INTERPRET`` in the environment
always wins. The decision must be applied before any ``@triton.jit`` function is defined, which is
why tests/conftest.py calls ``apply`` at import, before anything imports a kernel module.
"""
from __future__ import annotations

from collections.abc import MutableMapping


def interpret_setting(cuda_available: bool, env: MutableMapping[str, str]) -> str | None:
    """The ``TRITON_INTERPRET`` value to set, or None to leave the environment as it is."""
    if "TRITON_INTERPRET" in env:  # the user's explicit choice, either way
        return None
    return None if cuda_available else "1"


def cuda_available() -> bool:
    try:
        import torch
        return bool(torch.cuda.is_available())
    except Exception:  # no torch, or a torch without CUDA support: no device to compile for
        return False


def apply(env: MutableMapping[str, str]) -> str | None:
    """Set ``TRITON_INTERPRET`` in ``env`` where this machine has no CUDA device; returns what was set."""
    value = interpret_setting(cuda_available(), env)
    if value is not None:
        env["TRITON_INTERPRET"] = value
    return value
