"""Run a script or pytest in a fresh interpreter whose import system refuses some packages, as if they were
not installed (a bare GPU host has torch, triton, cuda-bindings and pytest, not the test extras)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PRELUDE = """
import importlib.abc, runpy, sys
BLOCKED = set(sys.argv[1].split(",")) - {""}

class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r} (not on a bare GPU host)", name=name)
        return None

sys.meta_path.insert(0, Refuse())
target, sys.argv = sys.argv[2], sys.argv[2:]
if target.endswith(".py"):
    sys.path.insert(0, str(__import__("pathlib").Path(target).resolve().parent))
    runpy.run_path(target, run_name="__main__")
else:
    runpy.run_module(target, run_name="__main__", alter_sys=True)
"""


def run_without(blocked: set[str], target: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """``target`` (a script path or a module name such as ``pytest``) with ``args``, from the repository root."""
    return subprocess.run([sys.executable, "-c", PRELUDE, ",".join(sorted(blocked)), target, *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)
