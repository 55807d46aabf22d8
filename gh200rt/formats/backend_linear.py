"""Which backend module multiplies each weight format on each device.

The modules are named by dotted path and imported the first time a device meets a format, so a format imports no
backend: the backend decides how a format is multiplied, and the CPU platform never imports the CUDA glue (nor
triton). Each module has ``linear(weight, x, bias, native)``; a CPU one also ``dense_for`` and ``block_form``
(``RefLinear``'s row blocks).
"""
from __future__ import annotations

import functools
import importlib
from types import ModuleType

LINEARS = {
    ("cpu", "packed"): "gh200rt.backends.cpu.packed_linear",
    ("cpu", "half"): "gh200rt.backends.cpu.half_linear",
    ("cuda", "packed"): "gh200rt.backends.cuda.format_linear",
    ("cuda", "half"): "gh200rt.backends.cuda.format_linear",
}


@functools.cache
def backend_linear(device_type: str, kind: str) -> ModuleType:
    """The module that multiplies ``kind`` (``"packed"``, ``"half"``) weights by activations on ``device_type``."""
    name = LINEARS.get((device_type, kind))
    if name is None:
        raise ValueError(f"no backend multiplies {kind} weights by activations on {device_type!r}; gh200rt computes "
                         f"on {' or '.join(sorted({d for d, _ in LINEARS}))}")
    return importlib.import_module(name)
