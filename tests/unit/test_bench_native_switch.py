"""`python -m gh200rt.bench ab native-switch` runs end to end (tiny settings) and prints a row per batch for each path."""
from pathlib import Path

import pytest

from gh200rt.backends.cpu.native import load_native_ops, native_ops_error
from tests.zygote import run_python

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(load_native_ops() is None, reason=f"native CPU ops unavailable: {native_ops_error()}")
@pytest.mark.parametrize("path", ["fp16-linear", "fp8-kv", "row-blocks", "batch-invariant"])
def test_it_times_both_settings(path, short_smollm2):
    done = run_python(["-m", "gh200rt.bench", "ab", "native-switch", "--path", path,
                           "--model", short_smollm2, "--batches", "1,2", "--tokens", "2", "--rounds", "1",
                           "--prompt", "8"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [line.split() for line in done.stdout.splitlines() if line.strip()[:1].isdigit()]
    assert [row[0] for row in rows] == ["1", "2"], done.stdout
    assert all(row[-2].endswith("x") and row[-1].endswith(f"/{row[0]}") for row in rows), done.stdout
