"""A measured profile (--profile-file): written from a bandwidth report by the functions the validation kit's
bandwidth step runs (python -m gh200rt.bench bandwidth --profile-out), read back by the planner, whose figures and
Plan.explain() then follow it; a bad file is a clear error naming the file."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from gh200rt.config import EngineConfig
from gh200rt.plan import main as plan_main
from gh200rt.platform.bandwidth import (ProfileFileError, load_measured_profile, profile_from_bandwidth_report,
                                        write_measured_profile)
from gh200rt.platform.detect import detect
from gh200rt.platform.profiles import get_profile
from gh200rt.serve.args import parse_args

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = "tests/fixtures/llama31_70b"
# bench bandwidth's JSON as an H100 host writes it (GPU readers, three sizes, two placements)
REPORT = {"machine": "x86-cuda", "results": [
    {"reader": "gpu-copy-h2d", "placement": "local-bind", "bytes": 64 << 20, "median_gbps": 18.5},
    {"reader": "gpu-copy-h2d", "placement": "local-bind", "bytes": 1 << 30, "median_gbps": 20.04},
    {"reader": "gpu-copy-h2d", "placement": "interleave", "bytes": 1 << 30, "median_gbps": 30.0},
    {"reader": "gpu-host-gemm", "placement": "local-bind", "bytes": 1 << 30, "median_gbps": 12.5}]}


def written_profile(tmp_path) -> Path:
    profile = profile_from_bandwidth_report(REPORT, "h100-sxm", "NVIDIA H100 80GB HBM3", "bench bandwidth (test)")
    return write_measured_profile(tmp_path / "measured_profile.json", profile)


def predicted_ms(out: str) -> float:
    return float(re.search(r"predicted decode step \(batch 1\): ([0-9.]+) ms", out).group(1))


def test_the_written_profile_takes_each_readers_largest_local_buffer(tmp_path):
    data = json.loads(written_profile(tmp_path).read_text())
    assert (data["link_h2d_gbps"], data["direct_read_gbps"]) == (20.04, 12.5)
    assert data["base_profile"] == "h100-sxm" and data["device_name"] == "NVIDIA H100 80GB HBM3"
    assert "hbm_gbps" not in data, "a figure nobody measured stays the built-in table's"


def test_the_planner_plans_with_the_measured_figures_and_says_so(tmp_path, capsys):
    path = written_profile(tmp_path)
    plat = detect("h100-sxm", measured_profile=path)
    builtin = get_profile("h100-sxm")
    assert (plat.link_h2d_gbps, plat.direct_read_gbps, plat.hbm_gbps) == (20.04, 12.5, builtin.hbm_gbps)
    args = ["--model", FIXTURE, "--platform", "h100-sxm", "--kv-cache-min-tokens", "100000"]
    assert plan_main(args) == 0
    table = capsys.readouterr().out
    assert plan_main(args + ["--profile-file", str(path)]) == 0
    measured = capsys.readouterr().out
    assert predicted_ms(measured) > 2 * predicted_ms(table), "a 20 GB/s link streams 70B layers slower than 55"
    assert f"host->device {builtin.link_h2d_gbps:g} GB/s" in table and "from the built-in h100-sxm table" in table
    assert "host->device 20.04 GB/s, direct read 12.5 GB/s" in measured
    assert f"host->device copy, direct read measured in {path} (NVIDIA H100 80GB HBM3, " in measured
    assert "the rest from the built-in h100-sxm table" in measured


def test_engine_and_server_flags_carry_the_profile_file(tmp_path):
    path = str(written_profile(tmp_path))
    assert EngineConfig.from_kwargs(profile_file=path).memory.profile_file == path
    _, engine = parse_args(["--profile-file", path])
    assert engine.memory.profile_file == path


@pytest.mark.parametrize("content,problem", [
    (None, "does not exist"),
    ("{not json", "is not valid JSON (line 1, column 2"),
    ("[55.2]", "holds a JSON list, not an object"),
    ('{"link_h2d_gbps": 55.2, "pcie_gen": 5}', "unknown field(s) ['pcie_gen']"),
    ('{"link_h2d_gbps": -3}', "link_h2d_gbps must be a positive number"),
    ('{"direct_read_gbps": "fast"}', "direct_read_gbps must be a positive number"),
    ('{"device_name": "H100"}', "holds no figure"),
])
def test_a_bad_profile_file_is_a_clear_error_naming_it(tmp_path, content, problem):
    path = tmp_path / "profile.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ProfileFileError, match=re.escape(problem)) as err:
        EngineConfig.from_kwargs(profile_file=str(path))
    assert str(path) in str(err.value)


def test_a_profile_measured_on_another_platform_is_refused(tmp_path, capsys):
    path = written_profile(tmp_path)
    with pytest.raises(ProfileFileError, match=r"measured on a h100-sxm host \(NVIDIA H100 80GB HBM3\), but this "
                                               r"run's profile is gh200-96g"):
        load_measured_profile(path, get_profile("gh200-96g"))
    assert plan_main(["--model", FIXTURE, "--platform", "gh200-96g", "--profile-file", str(path)]) == 2
    assert f"profile file {path} was measured on a h100-sxm host" in capsys.readouterr().err


def test_a_bad_profile_file_is_a_usage_error_of_the_server(tmp_path):
    path = tmp_path / "profile.json"
    path.write_text('{"link_h2d_gbps": 0}')
    proc = subprocess.run([sys.executable, "-m", "gh200rt.serve", "--profile-file", str(path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and f"profile file {path}: link_h2d_gbps must be a positive number" in proc.stderr


def test_numa_placement_writes_no_profile_without_a_gpu_reader(tmp_path):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: bandwidth measures it and writes the profile")
    proc = subprocess.run([sys.executable, "-m", "gh200rt.bench", "bandwidth", "--readers", "cpu-threads",
                           "--sizes-mib", "1", "--repeats", "1", "--no-plot", "--out", str(tmp_path), "--profile-out",
                           str(tmp_path / "p.json")], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})  # this checkout's gh200rt, not an install
    assert proc.returncode == 1 and "no profile written" in proc.stderr
    assert (tmp_path / "numa_placement.json").is_file() and not (tmp_path / "p.json").exists()


def test_the_cores_figures_set_where_a_cpu_tier_expert_runs(tmp_path, capsys):
    """cpu-linear's GB/s is the cores' weight rate, cpu-gemm's (64 rows of a bf16 weight) their TFLOP/s; the plan's
    limit on pairs computed by the cores follows them: slow cores hand every step's experts to the device."""
    report = {"machine": "x86-cuda", "results": REPORT["results"] + [
        {"reader": "cpu-linear", "placement": "local-bind", "bytes": 1 << 30, "median_gbps": 180.0},
        {"reader": "cpu-gemm", "placement": "local-bind", "bytes": 1 << 30, "median_gbps": 62.5}]}
    profile = profile_from_bandwidth_report(report, "h100-sxm", "NVIDIA H100 80GB HBM3", "bench bandwidth (test)")
    assert (profile["host_cpu_gbps"], profile["host_cpu_tflops"]) == (180.0, 4.0)
    path = write_measured_profile(tmp_path / "cores.json", profile)
    plat = detect("h100-sxm", measured_profile=path)
    assert (plat.host_cpu_gbps, plat.host_cpu_tflops) == (180.0, 4.0)
    args = ["--model", "tests/fixtures/qwen3_235b_a22b", "--platform", "h100-sxm", "--cpu-moe"]
    limits = {}
    for name, extra in (("table", []), ("measured", ["--profile-file", str(path)])):
        assert plan_main(args + extra) == 0
        out = capsys.readouterr().out
        limits[name] = int(re.search(r"routing at most (\d+) pairs", out).group(1))
    # a 37.7 MB expert (18.9M weights): copied at 20.04 GB/s and read from HBM, 1.895 ms, in which 4 TFLOP/s compute
    # 200 pairs; the table's 55.2 GB/s and 3 TFLOP/s: 0.695 ms, 55 pairs
    assert limits == {"table": 55, "measured": 200}, limits
    slow = write_measured_profile(tmp_path / "slow.json", {"base_profile": "h100-sxm", "host_cpu_gbps": 20.0})
    assert plan_main(args + ["--profile-file", str(slow)]) == 0
    assert "cpu-tier experts: computed on the device (the cores are slower even for one pair" in capsys.readouterr().out
