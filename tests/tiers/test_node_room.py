"""Slabs bound to a NUMA node that cannot hold them are refused up front, with the numbers and the flags
to change (MPOL_BIND past a node's memory gets the process killed by the kernel, with no Python error)."""
from pathlib import Path

import pytest

from gh200rt.config import EngineConfig
from gh200rt.engine.engine import LLMEngine
from gh200rt.weights import slabs
from gh200rt.weights.slabs import check_node_has_room, node_available_bytes
from tests.engine.real_models import save_tiny_llama

FIXTURES = Path(__file__).parents[1] / "numa" / "fixtures"
GIB = 1 << 30


def test_available_bytes_read_from_the_node_meminfo():
    assert node_available_bytes(1, FIXTURES / "x86-2socket") == 450 * GIB
    assert node_available_bytes(5, FIXTURES / "x86-2socket") is None


def test_too_large_for_the_node_is_a_clear_error():
    check_node_has_room(400 * GIB, 1, FIXTURES / "x86-2socket")
    with pytest.raises(ValueError, match=r"need 500.00 GiB .* NUMA node 1 .* only 450.00 GiB .*--host-weight-dtype"):
        check_node_has_room(500 * GIB, 1, FIXTURES / "x86-2socket")


def test_engine_refuses_before_allocating(tmp_path, monkeypatch):
    path = save_tiny_llama(str(tmp_path / "tiny"), num_layers=2)
    monkeypatch.setattr(slabs, "node_available_bytes", lambda node, sysfs_root="/sys": 1000)
    allocated = []
    monkeypatch.setattr(slabs, "allocate", lambda *a, **k: allocated.append(a))
    config = EngineConfig.from_kwargs(model=path, dtype="float32", max_model_len=64, offload="stream")
    with pytest.raises(ValueError, match="offloaded weights need"):
        LLMEngine.from_config(config)
    assert allocated == []
