"""The baseline a benchmark times this tree against, from another revision or a copy of another tree.

``--baseline REV|DIR`` of the kernel benchmarks: ``kernels_package`` copies the Triton kernels of a git revision
(``git show REV:kernels/...``) or of a directory holding a ``kernels/`` folder's files into a fresh package and
imports from it, every module beside the ones timed, since kernels import their neighbours. Both layouts are read:
``kernels/triton/<name>.py`` (``triton/`` first) and the older ``kernels/<name>.py``. ``native_library`` builds the
native CPU ops from another tree's ``kernels/cpu/*.c`` (every ``.c`` file there, not this tree's list: older
versions split them differently), ``module_file`` imports one module from a file (another version of a module).
"""
from __future__ import annotations

import importlib
import importlib.util
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from types import ModuleType

CHECKOUT = Path(__file__).resolve().parents[2]    # the git checkout this package runs from, where it is one
KERNELS = "kernels"
LAYOUTS = ("triton/", "")                          # where a kernel module lives under kernels/, newest first


def _git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(CHECKOUT), *args], capture_output=True, text=True, check=False)


def kernels_package(rev: str) -> str:
    """The name of a fresh package holding ``rev``'s ``kernels/**/*.py`` (a git revision, or a directory holding
    the files of a ``kernels/`` folder), subfolders kept; its top ``__init__.py`` is left empty."""
    package = Path(tempfile.mkdtemp(prefix="kernels_baseline_")) / "baseline_kernels"
    name = package.parent.name    # unique per load: a second baseline is not the first one's cached modules
    for relative, text in _kernel_sources(rev):
        target = package / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        # a kernel's neighbours are the baseline's too (older trees import them relatively, newer ones absolutely);
        # the weight formats it reads stay this tree's (weight_formats)
        target.write_text(re.sub(r"\bgh200rt\.kernels\b", name, text))
    (package / "__init__.py").write_text("")
    spec = importlib.util.spec_from_file_location(name, package / "__init__.py",
                                                  submodule_search_locations=[str(package)])
    sys.modules[name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sys.modules[name])
    return name


def kernel_module(package: str, name: str) -> ModuleType:
    """Module ``name`` of a ``kernels_package``: ``triton/<name>.py`` where the baseline has it, else ``<name>.py``."""
    home = Path(sys.modules[package].__file__).parent
    for layout in LAYOUTS:
        if (home / layout / f"{name}.py").is_file():
            return importlib.import_module(f"{package}.{layout.replace('/', '.')}{name}")
    raise SystemExit(f"the baseline has no kernels/{LAYOUTS[0]}{name}.py or kernels/{name}.py")


def weight_formats(package: str) -> ModuleType:
    """The weight formats a ``kernels_package``'s kernels read: the baseline's own ``quant.py`` where its kernels
    folder still held them, else this tree's (``gh200rt.formats.pack``), which its kernels import."""
    home = Path(sys.modules[package].__file__).parent
    if (home / "quant.py").is_file():
        return importlib.import_module(f"{package}.quant")
    return importlib.import_module("gh200rt.formats.pack")


def _kernel_sources(rev: str) -> list[tuple[Path, str]]:
    """(path under kernels/, text) of every Python file of ``rev``'s kernels, the top ``__init__.py`` aside."""
    if Path(rev).is_dir():
        found = [(path.relative_to(rev), path.read_text()) for path in sorted(Path(rev).rglob("*.py"))
                 if "__pycache__" not in path.parts]
    else:
        listed = _git("ls-tree", "-r", "--name-only", rev, f"{KERNELS}/")
        if listed.returncode:
            raise SystemExit(f"--baseline {rev}: cannot list {KERNELS}/ there: {listed.stderr.strip()}")
        found = []
        for line in listed.stdout.split():
            if line.endswith(".py"):
                shown = _git("show", f"{rev}:{line}")
                if shown.returncode:
                    raise SystemExit(f"--baseline {rev}: cannot read {line} there: {shown.stderr.strip()}")
                found.append((Path(line).relative_to(KERNELS), shown.stdout))
    return [(path, text) for path, text in found if path != Path("__init__.py")]


def holds_kernels(folder: Path, names: tuple[str, ...]) -> bool:
    """Whether ``folder`` (a copy of a ``kernels/`` folder) holds every module of ``names``, in either layout."""
    return all(any((folder / layout / f"{name}.py").is_file() for layout in LAYOUTS) for name in names)


def merge_base() -> str | None:
    """The merge-base of HEAD and main, where this package runs from a git checkout on another commit."""
    found = _git("merge-base", "HEAD", "main")
    head = _git("rev-parse", "HEAD").stdout.strip()
    return found.stdout.strip() if found.returncode == 0 and found.stdout.strip() != head else None


def module_file(path: str, name: str = "baseline_module") -> ModuleType:
    """The module in the file ``path`` (e.g. ``git show REV:gh200rt/kv/attention.py > FILE``), imported by path."""
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None:
        raise SystemExit(f"--baseline {path}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def native_library(source_dir: str):
    """The native CPU ops built from every ``.c`` file in ``source_dir`` (another tree's ``kernels/cpu``), its headers
    in the build's cache key as this tree's are."""
    from gh200rt.backends.cpu import native
    sources = tuple(sorted(Path(source_dir).glob("*.c")))
    if not sources:
        raise SystemExit(f"--baseline native:{source_dir}: no .c files there (give another tree's kernels/cpu)")
    try:
        return native.build_library(sources, tuple(sorted(Path(source_dir).glob("*.h"))))
    except (native.NativeOpsError, OSError, subprocess.SubprocessError) as exc:
        raise SystemExit(f"--baseline native:{source_dir}: {exc}") from None
    except AttributeError as exc:    # a function this tree's ops call is not in those sources
        raise SystemExit(f"--baseline native:{source_dir}: the library built there lacks {exc}") from None
