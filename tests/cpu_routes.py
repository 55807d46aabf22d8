"""The CPU routes the tests run on, whatever CPU runs them.

Every ``--cpu-route`` (``backends/cpu/routes.py``) is forced in turn, so route-dependent tests check each
route on every host that can execute it, not only the one its CPU would pick; plus two routes over another build
of the native CPU ops: ``fp32-portable``, the fp32 route with the ops built for the baseline x86-64 ISA, which
compiles the C code's portable paths (no AVX2 / FMA / F16C), the paths an Arm host without NEON runs (Grace's
NEON paths give the AVX2 build's bits: tests/kernels/test_cpu_native_aarch64.py); and ``bf16-no-amx``
on a CPU with AMX, the bf16 route with the ops built without AMX: the route a CPU with AVX-512 BF16 and no AMX
(AMD Zen 4) takes (the AVX-512 BF16 dot-product linear, not the AMX one). A route that cannot execute here is skipped with the
reason; ``pytest --cpu-routes fp32,bf16`` narrows the list (a CI lane per route). The ``cpu_route`` fixture
(tests/conftest.py) hands tests a ``TestRoute``; the terminal summary lists what ran and what was skipped.
"""
from __future__ import annotations

import contextlib
import platform
from dataclasses import dataclass

import pytest
import torch

from gh200rt.backends.cpu.routes import ROUTES, route_unavailable
from gh200rt.platform.cpu_features import cpu_flags

X86 = ("x86_64", "AMD64")


@dataclass(frozen=True)
class TestRoute:
    __test__ = False      # not a test class, for pytest's collector

    name: str             # the test id
    cpu_route: str        # the --cpu-route it forces
    native_flags: tuple[str, ...] = ()   # what replaces -march=native in the native build (none: the host's build)
    needs_flag: str = ""  # a CPU flag without which the build would be the host's own (the route is then skipped)

    @property
    def portable(self) -> bool:
        """Whether the route runs another build of the native ops, which a test forces in its own process only."""
        return bool(self.native_flags)

    @property
    def resident_form(self) -> str:
        """The class name of a resident linear's form on this route here, inside the route's context (its native
        build): the bf16 route's is the AMX tiles where the build runs them, else the AVX-512 BF16 dot-product
        layout where it runs those (``bf16-no-amx`` on an AMX CPU, the bf16 route on a Zen 4 or 5), else oneDNN's."""
        if self.cpu_route == "bf16":
            from gh200rt.backends.cpu.prepack import amx_available, bf16_dot_available
            return "AmxWeight" if amx_available() else "Bf16DotWeight" if bf16_dot_available() else "OneDNNWeight"
        return {"fp32": "NativeRowsWeight", "fp16": "HalfWeight"}[self.cpu_route]

    @property
    def options(self) -> dict:
        """Engine options that force this route (``EngineConfig.from_kwargs(**options)``)."""
        return {"cpu_route": self.cpu_route}

    @property
    def dtype(self) -> torch.dtype:
        """Compute dtype, and the KV cache's with ``--kv-cache-dtype auto``."""
        return torch.bfloat16 if self.cpu_route == "bf16" else torch.float32

    def unavailable(self) -> str | None:
        """Why this machine cannot execute the route (None: it can)."""
        why = route_unavailable(self.cpu_route)
        if why is not None or not self.portable:
            return why
        if platform.machine() not in X86:
            return f"on {platform.machine()} the native build is already the portable one (the fp32 route runs it)"
        if self.needs_flag and self.needs_flag not in cpu_flags():
            return f"this CPU has no {self.needs_flag}: the {self.cpu_route} route already runs without it"
        from gh200rt.backends.cpu.native import load_native_ops, native_ops_error
        return None if load_native_ops() is not None else f"native CPU ops unavailable: {native_ops_error()}"


NO_AMX = ("-march=native", "-mno-amx-tile", "-mno-amx-bf16", "-mno-amx-int8")
TEST_ROUTES = {route.name: route for route in
               [TestRoute(name, name) for name in ROUTES]
               + [TestRoute("fp32-portable", "fp32", ("-march=x86-64",)),
                  TestRoute("bf16-no-amx", "bf16", NO_AMX, needs_flag="amx_bf16")]}


def expected_routes(flags: frozenset[str], machine: str) -> set[str]:
    """The routes a CPU with ``flags`` must execute: a CI host whose route is skipped has a broken torch or
    compiler, not a slow CPU."""
    expected = {"fp32"}
    if machine in X86:
        expected.add("fp32-portable")
        if "avx2" in flags:
            expected.add("fp16")
        if {"avx512_bf16", "amx_bf16", "avx512bw"} & flags:
            expected.add("bf16")
        if "amx_bf16" in flags:
            expected.add("bf16-no-amx")
    return expected


def expected_here() -> set[str]:
    return expected_routes(cpu_flags(), platform.machine())


@contextlib.contextmanager
def native_build(flags: tuple[str, ...] = ("-march=x86-64",)):
    """Within: ``load_native_ops()`` hands out the native ops built with ``flags`` in place of ``-march=native``
    (default: the baseline x86-64 ISA), cached beside the native build under its own name (the flags are part
    of it)."""
    from gh200rt.backends.cpu import native, ops
    def forget_loaded_ops():
        native.load_native_ops.cache_clear()
        ops._native_ops_table.cache_clear()
    patch = pytest.MonkeyPatch()
    patch.setattr(native, "FLAGS", tuple(new for flag in native.FLAGS
                                             for new in (flags if flag == "-march=native" else (flag,))))
    forget_loaded_ops()
    try:
        yield
    finally:
        patch.undo()
        forget_loaded_ops()

