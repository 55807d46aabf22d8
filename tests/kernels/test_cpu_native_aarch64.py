"""The native CPU ops' Arm builds, checked on an x86 host under emulation: the NEON paths Grace runs and the portable
C an Arm host without them runs.

tests/kernels/aarch64/harness.c calls every exported kernel on fixed inputs; it is built (tests/kernels/aarch64/
builds.py) for aarch64 with Grace's ISA and for portable aarch64, both run under qemu-aarch64 at Grace's 128-bit
vector length, and for x86-64 (portable) and x86-64-v3 (AVX2), run here. What is held:

* the portable builds of both architectures give every output bit for bit (the same C, IEEE float32 on both);
* the Grace build gives the AVX2 build's bits for every output: the NEON paths run AVX2's operations per lane (the
  same fused multiply-adds, sums in the same order), so a query's attention, a linear's row and the prefix cache's
  invariance do not depend on which of an x86 or a Grace host served it;
* against the portable build, the Grace build's outputs without a vector path (row ops, the KV store, fp8, weight
  packing, dequantization) are bit-equal, and the linears and attention, which fuse multiply-adds where the portable
  C does not, agree to float32 rounding (the tolerances of test_cpu_native_portable.py);
* each build keeps its kernels' own contracts: an fp16 weight gives its float32 copy's bits, the thread count
  changes no bits, decode attention gives the multi-token kernel's bits, the fused decode block its three steps'.

Emulation proves bits, not speed: that is measured on a Grace machine."""
from __future__ import annotations

import platform

import pytest
import torch

from gh200rt.backends.cpu.native import SIGNATURES
from gh200rt.platform.cpu_features import cpu_flags
from tests.kernels.aarch64.builds import HARNESS, INSTALL_HINT, all_outputs, missing_tools

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"),
                       reason="the harness's native builds are x86's (on an Arm host the native tests run the NEON "
                              "build itself)"),
]
HAS_AVX2 = {"avx2", "fma", "f16c"} <= cpu_flags()
# outputs of the paths where the vector builds fuse multiply-adds and the portable C does not, with the tolerance
# each is held to against the portable build (bf16 outputs: the bf16 one)
ROUNDING = {"linear/": 1e-4, "quant/": 1e-4, "attn/decode/": 1e-5, "attn/extend/": 1e-5, "attn/decode-host/": 1e-5,
            "attn/extend-host/": 1e-5, "block/fused/": 1e-5,
            "block/steps/": 1e-5, "layer/out/": 1e-4, "layers/out/": 1e-3}   # three layers compound it
BF16_TOL = 1e-2


def test_the_harness_calls_every_exported_kernel():
    calls = HARNESS.read_text()
    assert not [name for name in SIGNATURES if f"{name}(" not in calls], "add them to tests/kernels/aarch64/harness.c"


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    why_not = missing_tools()
    if why_not is not None:
        pytest.skip(f"aarch64 kernel checks need a cross compiler and qemu: {why_not}; {INSTALL_HINT}")
    return all_outputs(tmp_path_factory.mktemp("aarch64"), lambda build: build.name != "x86-64-v3" or HAS_AVX2)


def as_tensor(kind: str, raw: bytes) -> torch.Tensor:
    if kind == "f32":
        return torch.frombuffer(bytearray(raw), dtype=torch.float32)
    if kind == "u16":
        return torch.frombuffer(bytearray(raw), dtype=torch.int16).view(torch.bfloat16).float()
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8 if kind == "u8" else torch.int32)


def describe(name: str, got: tuple[str, bytes], want: tuple[str, bytes]) -> str:
    a, b = as_tensor(*got), as_tensor(*want)
    differ = a != b
    worst = (a.double() - b.double()).abs().max().item() if a.is_floating_point() else float("nan")
    return f"{name}: {int(differ.sum())} of {a.numel()} differ, worst by {worst:.3g}"


def assert_same_bits(got: dict, want: dict, names=None):
    assert got.keys() == want.keys()
    differ = [describe(n, got[n], want[n]) for n in (names or got) if got[n] != want[n]]
    assert not differ, f"{len(differ)} outputs differ:\n" + "\n".join(differ[:20])


def test_the_portable_builds_agree_across_architectures(outputs):
    assert_same_bits(outputs["aarch64-portable"].records, outputs["x86-64"].records)


@pytest.mark.skipif(not HAS_AVX2, reason="this CPU cannot run the x86-64-v3 (AVX2) build")
def test_the_grace_build_gives_the_avx2_builds_bits(outputs):
    assert_same_bits(outputs["aarch64-grace"].records, outputs["x86-64-v3"].records)


def test_the_grace_build_against_the_portable_build(outputs):
    grace, portable = outputs["aarch64-grace"].records, outputs["aarch64-portable"].records
    fused = [n for n in grace if any(n.startswith(prefix) for prefix in ROUNDING)]
    assert_same_bits(grace, portable, [n for n in grace if n not in fused])
    for name in fused:
        tol = BF16_TOL if grace[name][0] == "u16" else next(t for p, t in ROUNDING.items() if name.startswith(p))
        torch.testing.assert_close(as_tensor(*grace[name]), as_tensor(*portable[name]), rtol=tol, atol=tol,
                                   msg=lambda m, name=name: f"{name}: {m}")
    # the vector paths ran: each kind of fused output has a bit the portable C computes otherwise
    for prefix in ("linear/f32/", "linear/f16/", "linear/fp8/", "quant/fmt0/", "quant/fmt1/", "quant/fmt2/",
                   "attn/decode/",
                   "attn/extend/"):
        assert any(grace[n] != portable[n] for n in fused if n.startswith(prefix)), f"{prefix}: portable bits"


def pairs(records: dict, old: str, new: str):
    """(name, name with `old` replaced by `new`) for every output whose name holds `old`"""
    return [(n, n.replace(old, new)) for n in records if old in n]


@pytest.mark.parametrize("build", ["aarch64-grace", "aarch64-portable", "x86-64-v3", "x86-64"])
def test_each_build_keeps_the_kernels_contracts(outputs, build):
    if outputs[build] is None:
        pytest.skip(f"the {build} build does not run on this CPU")
    records = outputs[build].records
    same = [("fp16 weight = its float32 copy", pairs(records, "linear/f16/", "linear/f32-of-f16/")),
            ("fp8 weight = its dequantized float32 copy", pairs(records, "linear/fp8/", "linear/f32-of-fp8/")),
            ("decode = the multi-token kernel", pairs(records, "attn/decode/", "attn/extend/")),
            ("host blocks read in place = the pool's", pairs(records, "attn/decode-host/", "attn/decode/")
             + pairs(records, "attn/extend-host/", "attn/extend/")),
            ("fused decode block = its three steps", pairs(records, "block/fused/", "block/steps/")),
            ("widened int4 codes = the nibbles", pairs(records, "quant/fmt2/", "quant/fmt1/")
             + pairs(records, "dequantize/fmt2/", "dequantize/fmt1/"))]
    if outputs[build].openmp:
        same += [("bits independent of the thread count", pairs(records, "threads1", "threads3")
                  + pairs(records, "linear/f16/", "linear/f16-1thread/")
                  + pairs(records, "linear/fp8/", "linear/fp8-1thread/"))]
    for contract, named in same:
        assert named, contract
        differ = [describe(a, records[a], records[b]) for a, b in named if records[a] != records[b]]
        assert not differ, f"{build}: {contract} broken:\n" + "\n".join(differ[:20])
    codes = {n: as_tensor(*records[n]).item() for n in records if n.startswith("rc/")}
    tiled = {n: code for n, code in codes.items() if n.startswith(("rc/amx/", "rc/bf16_dot/"))}
    assert all(code == 0 for n, code in codes.items() if n not in tiled), codes
    # no AMX or AVX-512 BF16 in any of these builds: the tiled bf16 products say so rather than run
    assert tiled and all(code == -1 for code in tiled.values()), tiled
    assert as_tensor(*records["tiled/amx_available"]).item() == 0
    assert as_tensor(*records["tiled/bf16_dot_available"]).item() == 0
