"""Preflight of a GPU host before scripts/validate_gpu.py runs anything long.

``--stage device`` needs only torch, triton and cuda-bindings (it runs before anything is installed):
torch sees a CUDA device (name, compute capability, memory); Triton compiles and runs a trivial kernel
(compiled, never interpreted); cuda-bindings imports and answers ``cudaDeviceGetAttribute`` for
``pageableMemoryAccess`` / ``pageableMemoryAccessUsesHostPageTables`` (1 on GH200: ATS).

``--stage registration`` needs gh200rt installed: the platform as gh200rt detects it (with the profile
bandwidths the report uses as rooflines), then the three registration semantics of a host slab
(gh200rt.backends.cuda.registration_check): ``is_pinned()``, a graph-captured non_blocking copy, and a
Triton kernel reading the slab in place. Any failure stops the validation with the reason.

Exit codes: 0 all checks passed, 1 a check failed, 2 no CUDA device is visible.

    python scripts/gpu_preflight.py --stage device [--json PATH]
"""
from __future__ import annotations

import argparse
import json
import os
import platform as pyplatform
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NO_GPU = ("no CUDA GPU is visible (torch.cuda.is_available() is False); run this on a GH200 or H100/H200 host "
          "of the test matrix")


def check(name: str, ok: bool, detail: str) -> dict:
    print(f"{'ok  ' if ok else 'FAIL'} {name}: {detail}", flush=True)
    return {"name": name, "ok": bool(ok), "detail": detail}


def trivial_triton_kernel() -> dict:
    os.environ["TRITON_INTERPRET"] = "0"  # judge the compiler, never the interpreter
    try:
        import torch
        import triton
        import triton.language as tl

        @triton.jit
        def add_one(x_ptr, n, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) + 1.0, mask=offs < n)

        x = torch.arange(1000, dtype=torch.float32, device="cuda")
        add_one[(triton.cdiv(1000, 256),)](x, 1000, BLOCK=256)
        torch.cuda.synchronize()
        ok = bool(torch.equal(x.cpu(), torch.arange(1000, dtype=torch.float32) + 1))
        kind = type(add_one).__name__
        return check("triton_compile", ok and kind == "JITFunction",
                     f"triton {triton.__version__} compiled and ran a kernel ({kind})" if ok
                     else "the compiled kernel computed a wrong result")
    except Exception as exc:
        return check("triton_compile", False, f"{type(exc).__name__}: {str(exc)[:400]}")


def device_stage() -> tuple[int, dict]:
    try:
        import torch
    except ImportError as exc:
        return 1, {"checks": [check("torch", False, f"torch does not import: {exc}")]}
    if not torch.cuda.is_available():
        print(f"gpu_preflight: {NO_GPU}", file=sys.stderr)
        return 2, {"checks": [check("cuda_device", False, NO_GPU)]}
    props = torch.cuda.get_device_properties(0)
    major, minor = torch.cuda.get_device_capability(0)
    facts = {"device": props.name, "capability": f"{major}.{minor}", "memory_bytes": props.total_memory,
             "torch": torch.__version__, "torch_cuda": torch.version.cuda, "machine": pyplatform.machine(),
             "python": pyplatform.python_version()}
    checks = [check("cuda_device", (major, minor) >= (8, 0),
                    f"{props.name}, capability {major}.{minor}, {props.total_memory / 2**30:.1f} GiB, torch "
                    f"{torch.__version__} (CUDA {torch.version.cuda})" + ("" if major == 9 else "; not a Hopper GPU"))]
    checks.append(trivial_triton_kernel())
    try:
        from cuda.bindings import runtime as rt
        err, count = rt.cudaGetDeviceCount()
        attrs = {}
        for name in ("PageableMemoryAccess", "PageableMemoryAccessUsesHostPageTables"):
            e, value = rt.cudaDeviceGetAttribute(getattr(rt.cudaDeviceAttr, f"cudaDevAttr{name}"), 0)
            attrs[name[0].lower() + name[1:]] = int(value) if e == rt.cudaError_t.cudaSuccess else None
        facts.update(attrs)
        ok = err == rt.cudaError_t.cudaSuccess and count >= 1 and None not in attrs.values()
        checks.append(check("cuda_bindings", ok, f"cuda.bindings.runtime sees {count} device(s); {attrs}"))
    except Exception as exc:
        checks.append(check("cuda_bindings", False, f"{type(exc).__name__}: {str(exc)[:400]}"))
    return (0 if all(c["ok"] for c in checks) else 1), {"facts": facts, "checks": checks}


def registration_stage() -> tuple[int, dict]:
    import torch
    if not torch.cuda.is_available():
        print(f"gpu_preflight: {NO_GPU}", file=sys.stderr)
        return 2, {"checks": [check("cuda_device", False, NO_GPU)]}
    checks = []
    try:
        import gh200rt.kernels
        import gh200rt.numa
        checks.append(check("gh200rt_install", True, f"gh200rt.numa from {os.path.dirname(gh200rt.numa.__file__)}, "
                                                     f"gh200rt.kernels from {os.path.dirname(gh200rt.kernels.__file__)}"))
    except ImportError as exc:
        checks.append(check("gh200rt_install", False, f"{exc}: install gh200rt (validate_gpu.py --wheelhouse DIR)"))
        return 1, {"checks": checks}
    from gh200rt.backends.cuda.registration_check import check_registered_slab, failure_message
    from gh200rt.platform.detect import detect
    platform = detect()
    facts = {k: getattr(platform, k) for k in ("kind", "device_name", "profile", "ats", "host_numa_node",
                                               "link_h2d_gbps", "direct_read_gbps", "hbm_gbps", "peak_tflops")}
    print(f"platform: {facts}")
    results = check_registered_slab(platform)
    checks += [check(f"registered_slab.{c.name}", c.ok, c.detail) for c in results]
    message = failure_message(results, platform.kind)
    if message:
        print(f"gpu_preflight: {message}\nStopping: the gpu tests and benchmarks would fail or mislead.", file=sys.stderr)
    return (1 if message else 0), {"platform": facts, "checks": checks}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stage", choices=["device", "registration"], required=True)
    parser.add_argument("--json", help="write the facts and checks to this file")
    args = parser.parse_args(argv)
    code, result = device_stage() if args.stage == "device" else registration_stage()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"stage": args.stage, "exit_code": code, **result}, f, indent=1)
    return code


if __name__ == "__main__":
    sys.exit(main())
