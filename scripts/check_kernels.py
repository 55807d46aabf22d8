"""Compile every gh200rt kernel for Hopper (sm_90) without a GPU and report what ptxas makes of it.

For each kernel at representative shapes and dtypes: registers, spill bytes, shared memory and the
widest global load in the PTX. Exits non-zero on a compile failure, any spill, shared memory past what an
sm_90 block may use (the launch would fail with OutOfResources on the card), host_gemm weight loads
narrower than 128 bits, or a kernel built for programmatic dependent launch (``USE_PDL``) whose PTX does not
wait for the kernel before it. Usage: ``python scripts/check_kernels.py`` (CI runs it after the tests).
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile

os.environ.pop("TRITON_INTERPRET", None)  # must be gone before any @triton.jit is defined
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.backends.nvidia.compiler import get_ptxas  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from gh200rt.kernels.triton.compile_specs import all_specs  # noqa: E402

TARGET = GPUTarget("cuda", 90, 32)
SHARED_LIMIT = 232448  # bytes of shared memory one block may use on sm_90 (227 KiB, opted in)
PTXAS_REGS = re.compile(r"Used (\d+) registers")
PTXAS_SPILL = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")


def widest_global_load(ptx: str) -> int:
    """Bits of the widest load from global memory: ``ld.global[.v2|.v4].b32`` etc. or ``cp.async`` (bytes)."""
    widest = 0
    for op in re.findall(r"ld\.global[^\s]*", ptx):
        width = re.search(r"(8|16|32|64|128)$", op)
        vec = re.search(r"\.v([248])\.", op)
        widest = max(widest, (int(width.group(1)) if width else 0) * (int(vec.group(1)) if vec else 1))
    for size in re.findall(r"cp\.async\.c[ag]\.shared\.global[^,]*,[^,]*,\s*(0x[0-9a-f]+|\d+)", ptx):
        widest = max(widest, 8 * int(size, 0))
    return widest


def ptxas_report(ptx: str) -> tuple[int, int]:
    """(registers, spill bytes) from ``ptxas -v`` on the PTX Triton produced."""
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "kernel.ptx")
        with open(src, "w") as f:
            f.write(ptx)
        out = subprocess.run([get_ptxas(TARGET.arch).path, "-v", "--gpu-name", "sm_90a", src, "-o", os.path.join(tmp, "k.cubin")],
                             capture_output=True, text=True, check=True)
    log = out.stderr + out.stdout
    regs = int(PTXAS_REGS.search(log).group(1))
    spills = sum(int(s) + int(l) for s, l in PTXAS_SPILL.findall(log))
    return regs, spills


def check(spec) -> tuple[bool, str]:
    fn = spec.fn
    attrs = {(fn.arg_names.index(a),): [["tt.divisibility", 16]] for a in spec.aligned}
    src = ASTSource(fn, spec.signature, spec.constexprs, attrs)
    compiled = triton.compile(src, target=TARGET, options=dict(num_warps=spec.num_warps))
    ptx = compiled.asm["ptx"]
    regs, spills = ptxas_report(ptx)
    shared = compiled.metadata.shared
    widest = widest_global_load(ptx)
    # a kernel launched with programmatic dependent launch must wait for the previous one (kernels/triton/pdl.py)
    unordered = spec.constexprs.get("USE_PDL", False) and "griddepcontrol.wait" not in ptx
    ok = spills == 0 and widest >= spec.min_load_bits and shared <= SHARED_LIMIT and not unordered
    row = f"{spec.name:<16} {spec.label:<56} {regs:>5} {spills:>7} {shared:>7} {widest:>5}-bit"
    if unordered:
        row += "  FAIL: USE_PDL without griddepcontrol.wait"
    if spills:
        row += "  FAIL: spills"
    if shared > SHARED_LIMIT:
        row += f"  FAIL: shared memory over {SHARED_LIMIT}"
    if widest < spec.min_load_bits:
        row += f"  FAIL: loads narrower than {spec.min_load_bits} bits"
    return ok, row


def main() -> int:
    print(f"{'kernel':<16} {'configuration':<56} {'regs':>5} {'spills':>7} {'shared':>7} {'widest load':>10}")
    failures = 0
    for spec in all_specs():
        try:
            ok, row = check(spec)
        except Exception as exc:  # a compile failure is a result to report, not a crash
            ok, row = False, f"{spec.name:<16} {spec.label:<56} FAIL: {type(exc).__name__}: {str(exc)[:200]}"
        failures += not ok
        print(row, flush=True)
    print(f"{failures} failure(s)" if failures else "all kernels compile for sm_90 without spills, within shared memory")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
