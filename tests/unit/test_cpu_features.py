"""CPU route selection: flags read from a cpuinfo file, and the route each kind of CPU gets."""
import torch

from gh200rt.backends.cpu import routes
from gh200rt.backends.cpu.half_linear import fbgemm_fp16_available
from gh200rt.backends.cpu.routes import choose_route, route_for
from gh200rt.platform import cpu_features
from gh200rt.platform.cpu_features import read_cpu_flags

CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
flags\t\t: fpu sse2 avx2 avx512f avx512_bf16 fma
bogomips\t: 4000

processor\t: 1
flags\t\t: fpu sse2
"""


def test_flags_come_from_the_first_cpu(tmp_path):
    path = tmp_path / "cpuinfo"
    path.write_text(CPUINFO)
    assert read_cpu_flags(str(path)) == frozenset({"fpu", "sse2", "avx2", "avx512f", "avx512_bf16", "fma"})
    assert read_cpu_flags(str(tmp_path / "missing")) is None
    (tmp_path / "empty").write_text("processor\t: 0\n")
    assert read_cpu_flags(str(tmp_path / "empty")) is None


def test_each_cpu_gets_its_fastest_accurate_route():
    sapphire_rapids = frozenset({"avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile"})
    zen4 = frozenset({"avx2", "avx512f", "avx512_bf16"})
    skylake_x = frozenset({"avx2", "avx512f"})
    haswell = frozenset({"avx2", "fma"})
    graviton = frozenset({"asimd", "sve"})
    assert choose_route(sapphire_rapids, True, True).name == "bf16"
    assert choose_route(frozenset({"amx_bf16"}), True, False).dtype == torch.bfloat16
    route = choose_route(zen4, True, True)
    assert (route.name, route.dtype, route.linear_format) == ("bf16", torch.bfloat16, "onednn-bf16")
    assert choose_route(zen4, False, True).name == "fp16"      # oneDNN cannot use bf16 here
    route = choose_route(skylake_x, True, True)
    assert (route.name, route.dtype, route.linear_format) == ("fp16", torch.float32, "fp16")
    assert choose_route(haswell, True, False).name == "fp32"   # no fbgemm
    route = choose_route(graviton, True, True)
    assert (route.name, route.dtype, route.linear_format) == ("fp32", torch.float32, "onednn-fp32")


def test_explicit_dtypes_override_detection():
    exact = route_for("float32")
    assert (exact.name, exact.dtype, exact.linear_format) == ("fp32", torch.float32, "onednn-fp32")
    assert route_for("bfloat16").dtype == torch.bfloat16
    assert route_for("float16").dtype == torch.float16 and route_for("float16").linear_format is None
    detected = choose_route(cpu_features.cpu_flags(), routes._onednn_bf16_ok(), fbgemm_fp16_available())
    assert route_for("auto") == detected
    assert detected.name in routes.describe(detected)
