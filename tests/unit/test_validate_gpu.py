import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_validate_gpu_refuses_without_a_gpu(tmp_path):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the real run belongs to the test matrix")
    proc = subprocess.run([sys.executable, "scripts/validate_gpu.py", "--out", str(tmp_path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "no CUDA GPU is visible" in proc.stderr
    assert not any(tmp_path.iterdir()), "nothing is written when nothing can run"
