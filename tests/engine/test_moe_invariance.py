"""Acceptance 2 on MoE models: greedy outputs do not depend on batching, preemption, prefix caching or chunked
prefill, though batching changes which tokens share an expert's GEMM (models/layers/moe_experts.py)."""
import pytest

from tests.engine.real_models import SharedModel
from tests.engine.test_invariance import check_invariance
from tests.model.tiny_checkpoints import VOCAB, save_tiny


@pytest.mark.parametrize("family", ["qwen3-moe-norm", "qwen2-moe-shared"])
def test_invariance_tiny_random_moe(tmp_path, family):
    path = str(tmp_path / family)
    save_tiny(family, path)
    check_invariance(SharedModel(path, "gh200rt"), vocab=VOCAB, max_tokens=16, small_pool=12)
