"""`pytest -m "gpu or gh200"` collects on a GPU host that has only torch, triton, cuda-bindings, pytest and
gh200rt's runtime packages: the test, benchmark and GGUF-reference packages are imported lazily (issue 10,
item 3). Each collection runs in a fresh interpreter whose import system refuses those packages, and must
find exactly the gpu tests a full environment finds, so a module that skips itself without them is caught
as surely as one that fails to import."""
import re
import tomllib
from pathlib import Path

import pytest

from tests.blocked_imports import run_without

ROOT = Path(__file__).resolve().parents[2]
# What a bare GPU host has besides gh200rt's runtime dependencies (the test matrix brings these).
GPU_HOST_HAS = {"torch", "triton", "cuda-bindings", "pytest", "pytest-timeout"}
IMPORT_NAMES = {"cuda-bindings": "cuda", "pytest-timeout": "pytest_timeout"}


def optional_imports() -> set[str]:
    """Import names of every package in the test and bench extras a GPU host need not have, and gguf (a
    runtime dependency gh200rt itself never imports; only tests use it, as a reference reader)."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    names = set()
    for spec in extras["test"] + extras["bench"]:
        dist = spec.split(";")[0].split("[")[0]
        for sep in "<>=!~ ":
            dist = dist.split(sep)[0]
        if dist not in GPU_HOST_HAS:
            names.add(IMPORT_NAMES.get(dist, dist.replace("-", "_").lower()))
    return names | {"gguf"}


def gpu_modules() -> list[str]:
    """The test modules that hold gpu or gh200 tests: tests/gpu/ and every other module that names the marks
    (``pytest.mark.gpu``, as ``pytestmark``, a decorator or a param's ``marks``). Collecting only these is what
    keeps two collections cheap; a gpu test elsewhere would have to name the mark too."""
    found = {str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("test_*.py")
             if p.parent.name == "gpu" or re.search(r"mark\.(gpu|gh200)\b", p.read_text())}
    return sorted(found)


def collect(blocked: set[str]) -> list[str]:
    proc = run_without(blocked, "pytest", "--collect-only", "-q", "-m", "gpu or gh200", "-p", "no:cacheprovider",
                       *gpu_modules())
    assert proc.returncode == 0, \
        f"collection failed with {sorted(blocked)} missing:\n{proc.stdout[-4000:]}\n{proc.stderr[-2000:]}"
    return sorted(line for line in proc.stdout.splitlines() if "::" in line)


def test_the_blocked_set_names_the_optional_packages():
    assert {"httpx", "psutil", "openai", "gguf", "transformers", "accelerate", "matplotlib"} <= optional_imports()
    assert not optional_imports() & {"torch", "triton", "cuda", "pytest"}


def test_the_blocker_really_refuses_imports():
    proc = run_without({"httpx"}, "json.tool", "--help")
    assert proc.returncode == 0, proc.stderr  # an unblocked module runs
    proc = run_without({"httpx"}, "httpx", timeout=60)
    assert proc.returncode != 0 and "not on a bare GPU host" in proc.stderr


def test_gpu_tests_collect_without_the_optional_packages():
    pytest.importorskip("torch")
    everything = collect(set())
    bare = collect(optional_imports())
    assert any(item.startswith("tests/gpu/") for item in everything), "no gpu tests were collected at all"
    missing = sorted(set(everything) - set(bare))
    assert not missing, f"{len(missing)} gpu test(s) are lost on a bare GPU host, e.g. {missing[:5]}"
