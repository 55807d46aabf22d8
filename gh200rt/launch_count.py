"""How many kernels a block of code launches: torch ops that do work, and Triton kernel launches.

``with counting_launches() as count: model(...)`` then ``count.total``, ``count.torch_ops`` and ``count.triton``
(name -> launches). On a GPU each counted torch op is at least one CUDA kernel (a library GEMM may add a split-K
reduction) and each Triton launch exactly one, so on the CPU — Triton kernels interpreted — it counts what the
same code launches on the card, which is what CUDA-graph replay gaps and launch overhead scale with. Ops that
only make views or allocate (``empty``) launch nothing and are not counted; work a Triton launch does on the
host (the interpreter copies tensors) is not counted either.
"""
from __future__ import annotations

import contextlib
from collections import Counter
from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode

_aten = torch.ops.aten
# ops that neither compute nor move data: a view without alias annotations, allocations, metadata
_NO_KERNEL = {_aten._unsafe_view.default, _aten.empty.memory_format, _aten.empty_strided.default,
              _aten.empty_like.default, _aten.new_empty.default, _aten.new_empty_strided.default,
              _aten.detach.default, _aten.lift_fresh.default, _aten.alias.default, _aten.set_.source_Storage,
              _aten.set_.source_Storage_storage_offset, _aten.resize_.default, _aten.sym_size.int,
              _aten.sym_stride.int, _aten.sym_numel.default, _aten.sym_storage_offset.default, _aten.dim.default,
              _aten.is_contiguous.default, _aten.stride.default, _aten.size.default}


@dataclass
class LaunchCount:
    torch_ops: Counter = field(default_factory=Counter)
    triton: Counter = field(default_factory=Counter)

    @property
    def total(self) -> int:
        return sum(self.torch_ops.values()) + sum(self.triton.values())

    def summary(self, top: int = 8) -> str:
        parts = [f"{n} {name}" for name, n in (self.triton + self.torch_ops).most_common(top)]
        return f"{self.total} launches ({sum(self.triton.values())} Triton): " + ", ".join(parts)


class _TorchOps(TorchDispatchMode):
    def __init__(self, count: LaunchCount):
        super().__init__()
        self.count = count
        self.paused = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not self.paused and not func.is_view and func not in _NO_KERNEL:
            self.count.torch_ops[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


def _launchers():
    """The classes whose ``run`` launches a Triton kernel: the compiled JIT function and the interpreter's."""
    from triton.runtime.jit import JITFunction
    classes = [JITFunction]
    try:
        from triton.runtime.interpreter import InterpretedFunction
        classes.append(InterpretedFunction)
    except ImportError:
        pass
    return classes


@contextlib.contextmanager
def counting_launches():
    count = LaunchCount()
    ops = _TorchOps(count)
    patched = []
    try:
        launchers = _launchers()
    except ImportError:  # no triton: torch ops only
        launchers = []
    for cls in launchers:
        real = cls.run

        def run(self, *args, _real=real, **kwargs):
            if not kwargs.get("warmup"):
                count.triton[self.fn.__name__] += 1
            ops.paused += 1
            try:
                return _real(self, *args, **kwargs)
            finally:
                ops.paused -= 1
        cls.run = run
        patched.append((cls, real))
    try:
        with ops:
            yield count
    finally:
        for cls, real in patched:
            cls.run = real
