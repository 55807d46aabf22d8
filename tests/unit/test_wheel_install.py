"""A regular wheel install imports every module, from outside the checkout.

The editable install, pytest's ``pythonpath`` and ``gh200rt.__path__``'s ``extend_path`` all find modules in
the checkout, so a package missing from the wheel goes unnoticed until someone installs it for real (the
first GPU host: 13 modules, ``gh200rt.engine.engine`` among them, failed to import). This builds the wheel
from this checkout, installs it into a fresh venv that sees this environment's dependencies but neither
the checkout nor the editable install's finder, and imports every module there.
"""
import shutil
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BUILD_INPUTS = ("pyproject.toml", "setup.py", "README.md", "gh200rt", "numa", "kernels")
MAPPED = {"gh200rt": "gh200rt", "numa": "gh200rt/numa", "kernels": "gh200rt/kernels"}  # source folder -> wheel

IMPORT_ALL = """
import importlib, pkgutil, sys
import gh200rt
root = sys.argv[1]
names = [m.name for m in pkgutil.walk_packages(gh200rt.__path__, "gh200rt.")]
failed, outside = [], []
for name in names:
    try:
        module = importlib.import_module(name)
    except Exception as exc:
        failed.append(f"{name}: {type(exc).__name__}: {exc}")
        continue
    if not getattr(module, "__file__", "").startswith(root):
        outside.append(f"{name}: {module.__file__}")
print(len(names))
for line in failed + outside:
    print(line)
"""


def source_modules() -> set[str]:
    """Every .py file of the three source folders, as its path inside the wheel."""
    found = set()
    for folder, target in MAPPED.items():
        for path in (ROOT / folder).rglob("*.py"):
            if "__pycache__" not in path.parts:
                found.add(f"{target}/{path.relative_to(ROOT / folder).as_posix()}")
    return found


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    # built from a copy: setuptools builds in the source's build/ folder, and a stale one would ship old files
    source = tmp_path_factory.mktemp("source") / "gh200rt"
    source.mkdir()
    for name in (n for n in BUILD_INPUTS if (ROOT / n).exists()):
        copy = shutil.copytree if (ROOT / name).is_dir() else shutil.copy2
        copy(ROOT / name, source / name, **({"ignore": shutil.ignore_patterns("__pycache__")}
                                            if (ROOT / name).is_dir() else {}))
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                           "--disable-pip-version-check", "-q", "-w", str(out), str(source)],
                          capture_output=True, text=True, timeout=300, env=_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    (built,) = out.glob("gh200rt-*.whl")
    return built


def _env() -> dict:
    import os
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}


def test_wheel_ships_every_module_and_the_native_sources(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = sorted(source_modules() - names)
    assert not missing, f"{len(missing)} modules are not in the wheel: {missing[:10]}"
    c_sources = {f"gh200rt/kernels/{p.relative_to(ROOT / 'kernels').as_posix()}"
                 for p in (ROOT / "kernels" / "cpu").iterdir() if p.suffix in (".c", ".h")}
    assert c_sources and c_sources <= names, sorted(c_sources - names)


def test_wheel_installed_in_a_fresh_venv_imports_every_module(wheel, tmp_path):
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=False)
    python = env_dir / "bin" / "python"
    purelib = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                  capture_output=True, text=True, check=True).stdout.strip())
    # the dependencies come from this environment, as a plain path entry: its .pth files (the editable
    # install's finder among them) are not read from there
    (purelib / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    proc = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps",
                           "--no-index", "--disable-pip-version-check", "-q", str(wheel)],
                          capture_output=True, text=True, timeout=300, env=_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    proc = subprocess.run([str(python), "-c", IMPORT_ALL, str(purelib)], capture_output=True, text=True,
                          timeout=300, cwd=outside, env=_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    count, *problems = proc.stdout.splitlines()
    expected = len(source_modules()) - 1    # every module but gh200rt itself, which walk_packages starts from
    assert int(count) == expected, f"walked {count} modules of the install, the source has {expected}"
    assert not problems, "\n".join(problems)
