"""``--cpu-route`` forces a CPU route: a frozen config field with its flag, checked against --dtype; a route that
cannot execute here is refused with the reason, never swapped; and the routes the tests force (tests/cpu_routes.py)
include every route this CPU supports, so CI cannot quietly skip one."""
import argparse
import platform

import pytest
import torch

from gh200rt.backends.cpu import native, prepack, routes
from gh200rt.backends.cpu.routes import ROUTES, route_for, routes_available
from gh200rt.cli_args import add_engine_arguments, engine_config_from_args
from gh200rt.config import EngineConfig, ModelConfig
from tests.cpu_routes import TEST_ROUTES, expected_here, expected_routes, native_build


def test_the_flag_sets_the_field():
    parser = argparse.ArgumentParser()
    add_engine_arguments(parser)
    config = engine_config_from_args(parser, parser.parse_args(["--cpu-route", "fp16"]))
    assert config.model.cpu_route == "fp16" and config.model.dtype == "auto"
    assert EngineConfig.from_kwargs().model.cpu_route == "auto"


@pytest.mark.parametrize("route,dtype", [("fp16", "float32"), ("fp16", "bfloat16"), ("bf16", "float32"),
                                         ("fp32", "bfloat16"), ("fp32", "float16")])
def test_a_route_and_a_dtype_that_disagree_are_refused(route, dtype):
    with pytest.raises(ValueError, match=f"--cpu-route {route} computes in .* not --dtype {dtype}: leave --dtype auto"):
        ModelConfig(cpu_route=route, dtype=dtype)


def test_a_route_with_its_own_dtype_or_auto_is_accepted():
    for route in ROUTES:
        assert ModelConfig(cpu_route=route).cpu_route == route
    assert ModelConfig(cpu_route="bf16", dtype="bfloat16").dtype == "bfloat16"
    assert ModelConfig(cpu_route="fp32", dtype="float32").dtype == "float32"
    with pytest.raises(ValueError, match="--cpu-route 'amx'"):
        ModelConfig(cpu_route="amx")


@pytest.mark.parametrize("name", routes_available())
def test_a_forced_route_wins_over_detection(name):
    assert route_for("auto", name) == routes._ROUTES[name]


def test_a_route_that_cannot_execute_is_refused_with_the_reason(monkeypatch):
    monkeypatch.setattr(routes, "_onednn_bf16_ok", lambda: False)
    with pytest.raises(ValueError, match=r"--cpu-route bf16: this torch's oneDNN reports no bf16 support .*; this "
                                         r"machine runs .*fp32 \(or leave --cpu-route auto\)"):
        route_for("auto", "bf16")
    assert route_for("auto", "fp32").dtype == torch.float32


def test_every_route_this_cpu_supports_executes():
    """A route the CPU's features promise but this process cannot run means a broken torch build or compiler:
    CI must fail, not skip it."""
    missing = {name: TEST_ROUTES[name].unavailable() for name in expected_here()
               if TEST_ROUTES[name].unavailable() is not None}
    assert not missing, f"routes this CPU supports that cannot execute: {missing}"


def test_expected_routes_follow_the_cpu():
    x86 = "x86_64"
    assert expected_routes(frozenset({"avx2", "avx512f", "avx512bw", "avx512_bf16"}), x86) == \
        {"fp32", "fp32-portable", "fp16", "bf16"}                                 # Zen 4
    assert expected_routes(frozenset({"avx2", "avx512bw", "amx_bf16"}), x86) == \
        {"fp32", "fp32-portable", "fp16", "bf16", "bf16-no-amx"}                  # Sapphire Rapids
    assert expected_routes(frozenset({"avx2", "fma"}), x86) == {"fp32", "fp32-portable", "fp16"}   # AVX2 only
    assert expected_routes(frozenset({"fp", "asimd", "bf16", "sve2"}), "aarch64") == {"fp32"}    # Grace


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="the baseline build is x86-64's")
def test_the_portable_route_loads_the_baseline_build():
    if TEST_ROUTES["fp32-portable"].unavailable() is not None:
        pytest.skip(TEST_ROUTES["fp32-portable"].unavailable())
    vector = native.load_native_ops()
    with native_build():
        portable = native.load_native_ops()
        assert "-march=x86-64" in native.FLAGS and portable._lib._name != vector._lib._name
    assert native.load_native_ops()._lib._name == vector._lib._name


def test_the_no_amx_route_loads_a_build_without_tiles():
    route = TEST_ROUTES["bf16-no-amx"]
    if route.unavailable() is not None:
        pytest.skip(route.unavailable())
    assert native.load_native_ops().amx_available()
    with native_build(route.native_flags):
        built = native.load_native_ops()
        assert "-mno-amx-tile" in native.FLAGS and not built.amx_available() and built.bf16_dot_available()
        assert not prepack.amx_available()
    assert native.load_native_ops().amx_available()
