"""scripts/serve_smoke.py, the validation kit's serve step: it starts `python -m gh200rt.serve` outside the
checkout, sends sampled, streamed, structured and n=2 requests and a `python -m gh200rt.bench serve` run, fails
when any request fails, and leaves no server behind: not on success, not on failure, not when killed on its cap."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.server.byte_llama import save_byte_llama

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable


def smoke(*args, timeout=300):
    return subprocess.run([PY, "scripts/serve_smoke.py", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


def gone(pid: int) -> bool:
    stat = Path(f"/proc/{pid}/stat")
    return not stat.exists() or stat.read_text().split()[2] == "Z"


@pytest.fixture(scope="module")
def byte_llama(tmp_path_factory):
    return save_byte_llama(str(tmp_path_factory.mktemp("byte-llama")))


def test_every_request_kind_passes_and_the_server_is_stopped(byte_llama, tmp_path):
    proc = smoke("--model", byte_llama, "--json", str(tmp_path / "smoke.json"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    result = json.loads((tmp_path / "smoke.json").read_text())
    assert [c["name"] for c in result["checks"]] == ["start", "sampled", "streamed", "structured json_schema", "n=2",
                                                     "bench_serving"]
    assert all(c["ok"] for c in result["checks"]) and "successful requests: 32 / 32" in proc.stdout
    assert result["server_stopped"].startswith("stopped by SIGTERM") and gone(result["server_pid"])
    assert result["gh200rt_from"].endswith("gh200rt")


def test_a_server_that_cannot_start_fails_the_run(tmp_path):
    (tmp_path / "empty").mkdir()  # no config.json: the engine cannot load, the server exits
    proc = smoke("--model", str(tmp_path / "empty"), "--json", str(tmp_path / "smoke.json"), "--load-timeout", "60")
    result = json.loads((tmp_path / "smoke.json").read_text())
    assert proc.returncode == 1 and not result["ok"] and "FAIL start: the server exited" in proc.stdout
    assert "has no config.json" in result["server_log_tail"] and gone(result["server_pid"])


def start_smoke(model: str) -> tuple[subprocess.Popen, int]:
    """serve_smoke.py in its own process group (as validate_gpu.py runs a step), once its server started."""
    proc = subprocess.Popen([PY, "scripts/serve_smoke.py", "--model", model], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    for line in proc.stdout:
        if line.startswith("server pid "):
            return proc, int(line.split()[2])
    raise AssertionError(f"serve_smoke.py never started its server (exit {proc.wait()})")


@pytest.mark.parametrize("how", ["SIGKILL to the step's group (its time cap)", "SIGTERM to serve_smoke.py"])
def test_a_stopped_step_leaves_no_server(byte_llama, how):
    proc, server = start_smoke(byte_llama)
    try:
        if how.startswith("SIGKILL"):
            os.killpg(proc.pid, signal.SIGKILL)
        else:
            proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
        deadline = time.monotonic() + 5
        while not gone(server) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert gone(server), f"server {server} outlived serve_smoke.py ({how})"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.stdout.close()


def test_bench_serve_exits_1_when_requests_fail():
    proc = subprocess.run([PY, "-m", "gh200rt.bench", "serve", "--base-url", "http://127.0.0.1:9", "--model", "m",
                           "--num-prompts", "2", "--timeout", "5"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "NO_PROXY": "*"})
    assert proc.returncode == 1 and "(failed: 2)" in proc.stdout
