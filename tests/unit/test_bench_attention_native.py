"""`python -m gh200rt.bench kernel cpu-attention` times the native kernels of another source tree against this
one's (--baseline native:DIR), here a copy of this tree's sources with a comment added: a second library of the
same kernels, so every row must agree to the bit."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gh200rt.backends.cpu import native
from gh200rt.backends.cpu.native import load_native_ops, native_ops_error

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(load_native_ops() is None, reason=f"native CPU ops unavailable: {native_ops_error()}")
def test_native_baseline_from_another_source_tree(tmp_path):
    sources = tmp_path / "cpu"
    shutil.copytree(ROOT / "kernels" / "cpu", sources)
    with open(sources / "decode_attention.c", "a") as f:
        f.write("/* the baseline's copy */\n")
    # this tree's library, already built for the session, seeds the cache: the copy is the one build the run makes
    built = native._build(native._compiler(), native.SOURCES, native.HEADERS)
    (tmp_path / "native").mkdir()
    shutil.copy2(built, tmp_path / "native" / built.name)
    done = subprocess.run([sys.executable, "-m", "gh200rt.bench", "kernel", "cpu-attention", "--baseline",
                           f"native:{sources}", "--only", "8 decodes, context ~128", "--reps", "1"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "GH200RT_CACHE_DIR": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [line.split() for line in done.stdout.splitlines() if line.startswith("8 decodes, context ~128")]
    assert [row[4] for row in rows] == ["float32", "bfloat16"], done.stdout
    assert all(float(row[-1]) == 0.0 and row[-2].endswith("x") for row in rows), done.stdout
    assert len(list((tmp_path / "native").glob("*.so"))) == 2   # this tree's build and the copy's
