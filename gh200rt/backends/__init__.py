"""Execution backends, one package each, chosen once at start-up from the device the engine computes on.

``cpu/``: the CPU route's Python (the route choice, resident weight forms, the native C library's loading and
calls, the one-call decode layer, the host allocator); ``cuda/``: the CUDA route's (the Triton ops, the fused decode
layer and MoE glue, CUDA graph capture, the host-registration check). Their kernels are in the top-level ``kernels/``
(``kernels/cpu/*.c``, ``kernels/triton/*.py``). ``interface.py`` holds what both fill in: the layers' swap hooks
and the torch ops behind them.

Each backend's ``backend.py`` answers the engine's questions: ``linear_format(loaded, config)`` (the form its
resident linears take), ``resident_forms(module, config, quantized)`` (that form for a module the weight store does
not place: a speculative draft) and ``install_kernels(model, config, device)`` (its ops into the model's hooks).
``BACKENDS`` names each by dotted path and ``backend_for`` imports only the one chosen, so the CPU platform never
imports Triton glue.
"""
from __future__ import annotations

import importlib
from types import ModuleType

BACKENDS = {"cpu": "gh200rt.backends.cpu.backend", "cuda": "gh200rt.backends.cuda.backend"}


def backend_for(device: str) -> ModuleType:
    """The backend module for ``device`` (``"cpu"``, ``"cuda"``, ``"cuda:1"``)."""
    kind = device.split(":", 1)[0]
    if kind not in BACKENDS:
        raise ValueError(f"no backend computes on {device!r}; gh200rt runs on {' or '.join(BACKENDS)}")
    return importlib.import_module(BACKENDS[kind])
