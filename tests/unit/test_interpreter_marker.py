"""Tests that launch Triton kernels on CPU tensors need the interpreter: where it is off (a CUDA host,
where the gpu tests judge the compiled kernels) they are skipped with the reason, never run compiled
against CPU pointers."""
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]


def run_pytest(interpret: str) -> str:
    env = {**os.environ, "TRITON_INTERPRET": interpret}
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
                          "tests/kernels/test_elementwise.py", "-k", "silu"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    return out.stdout


def test_interpreter_tests_skip_cleanly_when_it_is_off():
    out = run_pytest("0")
    assert "passed" not in out.splitlines()[-1] and "skipped" in out.splitlines()[-1], out[-2000:]
    assert "needs TRITON_INTERPRET=1" in out


def test_interpreter_tests_run_when_it_is_on():
    out = run_pytest("1")
    assert "passed" in out.splitlines()[-1] and "skipped" not in out.splitlines()[-1], out[-2000:]
