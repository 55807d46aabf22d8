"""The peers' worker runs by file path under --peer-python, an environment without gh200rt (or torch): its top level
imports the standard library only, and ``peers`` starts it that way for a peer and as a module for gh200rt."""
import ast
import subprocess
import sys
from pathlib import Path

import pytest

from gh200rt.bench import peer_worker

WORKER = Path(peer_worker.__file__)


def test_its_top_level_imports_only_the_standard_library():
    tree = ast.parse(WORKER.read_text())
    names = {alias.name.partition(".")[0] for node in tree.body if isinstance(node, ast.Import) for alias in node.names}
    names |= {node.module.partition(".")[0] for node in tree.body if isinstance(node, ast.ImportFrom)}
    assert names - {"__future__"} <= set(sys.stdlib_module_names), names


def test_it_loads_by_path_without_site_packages():
    code = f"import runpy; runpy.run_path({str(WORKER)!r}, run_name='worker'); print('loaded')"
    proc = subprocess.run([sys.executable, "-S", "-I", "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "loaded", proc.stderr


def test_peers_start_it_by_path_and_gh200rt_as_a_module():
    pytest.importorskip("httpx")  # the bench extra: a bare GPU host need not have it
    from gh200rt.bench import peers
    assert peers.worker_command("vllm:bfloat16", "/peers/bin/python") == ["/peers/bin/python", str(WORKER)]
    assert peers.worker_command("gh200rt:auto", "/peers/bin/python") == [sys.executable, "-m",
                                                                        "gh200rt.bench.peer_worker"]
