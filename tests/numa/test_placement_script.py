import json
from pathlib import Path

from tests.zygote import run_python

ROOT = Path(__file__).resolve().parents[2]


def _run(*args):
    return run_python(["-m", "gh200rt.bench", "bandwidth", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)


def test_list_says_what_runs_and_why_the_rest_is_skipped():
    proc = _run("--list")
    assert proc.returncode == 0, proc.stderr
    assert "will run: cpu-threads x local-bind" in proc.stdout
    assert "skipped: gpu-copy-h2d: no CUDA GPU visible" in proc.stdout
    assert "skipped: remote-bind: this machine has a single CPU node" in proc.stdout


def test_small_run_writes_json_and_png(tmp_path):
    proc = _run("--sizes-mib", "1", "4", "--repeats", "2", "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    report = json.loads((tmp_path / "numa_placement.json").read_text())
    rows = {(r["reader"], r["placement"], r["bytes"]) for r in report["results"]}
    assert ("cpu-threads", "local-bind", 4 << 20) in rows and ("cpu-threads", "first-touch", 1 << 20) in rows
    assert all(0 < r["min_gbps"] <= r["median_gbps"] <= r["max_gbps"] for r in report["results"])
    assert (tmp_path / "numa_placement.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "median GB/s" in proc.stdout


def test_bad_repeats_is_a_usage_error(tmp_path):
    proc = _run("--repeats", "0", "--out", str(tmp_path))
    assert proc.returncode == 2 and "--repeats" in proc.stderr


def test_without_matplotlib_the_measurements_are_kept(tmp_path):
    from tests.blocked_imports import run_without
    proc = run_without({"matplotlib"}, "gh200rt.bench", "bandwidth", "--sizes-mib", "1", "--repeats", "1",
                       "--readers", "cpu-threads", "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "no plot: No module named 'matplotlib'" in proc.stdout
    report = json.loads((tmp_path / "numa_placement.json").read_text())
    assert {r["reader"] for r in report["results"]} == {"cpu-threads"}
    assert not (tmp_path / "numa_placement.png").exists()


def test_unknown_reader_is_refused():
    proc = _run("--list", "--readers", "cpu-threads,gpu-magic")
    assert proc.returncode == 2 and "unknown reader(s) gpu-magic" in proc.stderr


def test_the_cores_readers_measure_a_profile_for_the_cpu_expert_tier(tmp_path):
    """cpu-linear (one row) and cpu-gemm (64 rows) multiply the buffer as a bf16 weight on the host's cores; their
    local-bind figures become the measured profile's host_cpu_gbps / host_cpu_tflops."""
    path = tmp_path / "profile.json"
    proc = _run("--sizes-mib", "4", "--repeats", "1", "--readers", "cpu-linear,cpu-gemm", "--out", str(tmp_path),
                "--profile-out", str(path))
    assert proc.returncode == 0, proc.stderr
    rows = {r["reader"]: r for r in json.loads((tmp_path / "numa_placement.json").read_text())["results"]
            if r["placement"] == "local-bind"}
    data = json.loads(path.read_text())
    assert data["host_cpu_gbps"] == round(rows["cpu-linear"]["median_gbps"], 2) > 0
    assert data["host_cpu_tflops"] == round(rows["cpu-gemm"]["median_gbps"] * 64 / 1000, 2) > 0
    assert "link_h2d_gbps" not in data
