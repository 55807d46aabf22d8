"""Run everything that needs real GPU hardware and write one report.

On a GH200 or x86 H100/H200 host of the test matrix:

    python scripts/validate_gpu.py --out results/validate

runs the `gpu` / `gh200` tests (tests/gpu: transfer backend, device views, direct weights, Triton
kernels in the model; tests/kernels/test_gpu_kernels.py), the Hopper kernel compile check and the
benchmarks that have GPU readers, and writes `report.md` + `report.json` with every command, its
exit code, its duration and the tail of its output. Without a CUDA GPU it says so and exits 2
(nothing here can run).

Every step runs with ``TRITON_INTERPRET=0``: tests/conftest.py turns the Triton interpreter on
unless the variable is set, and interpreted kernels would prove nothing about the compiled ones.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _steps(out: Path, quick: bool) -> list[tuple[str, list[str]]]:
    py = sys.executable
    return [
        ("gpu and gh200 tests", [py, "-m", "pytest", "-q", "-rs", "-m", "gpu or gh200", "tests"]),
        ("kernel compile check", [py, "scripts/check_kernels.py"]),
        ("numa placement", [py, "scripts/numa_placement.py", "--out", str(out / "numa")] + (["--quick"] if quick else [])),
        ("decode per placement", [py, "scripts/bench_decode.py"] + (["--quick"] if quick else [])),
    ]


def step_env() -> dict[str, str]:
    """The environment of every step: compiled Triton kernels, never the interpreter."""
    return {**os.environ, "TRITON_INTERPRET": "0"}


def _cuda_device_name() -> str | None:
    try:
        import torch
        return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except Exception:
        return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "validate", help="report directory")
    parser.add_argument("--quick", action="store_true", help="short benchmark runs")
    args = parser.parse_args(argv)

    device = _cuda_device_name()
    if device is None:
        print("validate_gpu: no CUDA GPU is visible (torch.cuda.is_available() is False); "
              "run this on a GH200 or H100/H200 host of the test matrix.", file=sys.stderr)
        return 2

    args.out.mkdir(parents=True, exist_ok=True)
    env = step_env()
    results = []
    for name, cmd in _steps(args.out, args.quick):
        start = time.perf_counter()
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
        results.append({"step": name, "command": " ".join(cmd), "exit_code": proc.returncode,
                        "seconds": round(time.perf_counter() - start, 1),
                        "output_tail": (proc.stdout + proc.stderr)[-4000:]})
        print(f"{'ok ' if proc.returncode == 0 else 'FAIL'} {name} ({results[-1]['seconds']} s)")

    (args.out / "report.json").write_text(json.dumps({"device": device, "steps": results}, indent=2))
    lines = [f"# GPU validation on {device}", ""]
    for r in results:
        lines += [f"## {r['step']}: exit {r['exit_code']} in {r['seconds']} s", "", f"`{r['command']}`", "",
                  "```", r["output_tail"], "```", ""]
    (args.out / "report.md").write_text("\n".join(lines))
    print(f"report: {args.out / 'report.md'}")
    return 0 if all(r["exit_code"] == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
