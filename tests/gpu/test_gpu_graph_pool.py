"""The decode graphs' pool survives every graph being dropped (a tier move), on a GPU, each case in a fresh
process (tests/gpu/graph_pool_runs.py): the first H100 run aborted there, at the first recapture after a
move, in the allocator's ``use_count > 0`` assertion."""
import subprocess
import sys
from pathlib import Path

import pytest

from tests.engine.real_models import save_tiny_llama
from tests.graphs.decode_runs import LAYERS

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[2]


def run_scenario(*args: str) -> str:
    proc = subprocess.run([sys.executable, "-m", "tests.gpu.graph_pool_runs", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    print(proc.stdout)
    return proc.stdout


def test_captures_after_every_graph_is_dropped_reuse_the_pool_without_aborting():
    assert "4 generations captured" in run_scenario("recapture-over-a-live-block")


def test_dynamic_tiers_with_graphs_through_20_moves_match_eager_moves(tmp_path):
    model_dir = save_tiny_llama(str(tmp_path / "tiny6"), num_layers=LAYERS)
    out = run_scenario("tier-moves", model_dir)
    assert "graphs=True" in out
