"""scripts/validate_gpu.py runs the gpu-marked tests (tests/gpu included) with compiled Triton kernels."""
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def load_script():
    spec = importlib.util.spec_from_file_location("validate_gpu", ROOT / "scripts" / "validate_gpu.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_gpu_tests_step_collects_tests_gpu(tmp_path):
    script = load_script()
    commands = dict(script._steps(tmp_path, quick=True))
    cmd = commands["gpu and gh200 tests"]
    assert cmd[cmd.index("-m", 2) + 1] == "gpu or gh200"
    assert cmd[-1] == "tests" and (ROOT / "tests" / "gpu").is_dir()


def test_steps_run_compiled_kernels_not_the_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert load_script().step_env()["TRITON_INTERPRET"] == "0"
