"""tests/conftest.py interprets Triton kernels only where no CUDA device exists (issue 10, item 11)."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.triton_mode import apply, interpret_setting

ROOT = Path(__file__).resolve().parents[2]


def test_no_cuda_device_interprets():
    assert interpret_setting(False, {}) == "1"


def test_a_cuda_device_compiles():
    assert interpret_setting(True, {}) is None


@pytest.mark.parametrize("cuda", [False, True], ids=["cpu", "cuda"])
@pytest.mark.parametrize("explicit", ["0", "1", ""])
def test_an_explicit_setting_wins(cuda, explicit):
    env = {"TRITON_INTERPRET": explicit}
    assert interpret_setting(cuda, env) is None
    assert env == {"TRITON_INTERPRET": explicit}


def test_apply_sets_the_variable_on_this_machine(monkeypatch):
    torch = pytest.importorskip("torch")
    env = {}
    value = apply(env)
    if torch.cuda.is_available():
        assert value is None and env == {}
    else:
        assert value == "1" and env == {"TRITON_INTERPRET": "1"}


def test_conftest_decides_before_the_kernels_are_defined():
    """A fresh session without the variable: the kernels it defines are interpreted exactly when no GPU exists."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("triton")
    probe = ROOT / "tests" / "unit" / "triton_mode_probe.py"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", str(probe)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    want = "JITFunction" if torch.cuda.is_available() else "InterpretedFunction"
    assert f"kernel type: {want}" in proc.stdout, proc.stdout[-3000:]
