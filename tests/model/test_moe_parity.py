"""MoE families vs transformers on tiny random checkpoints (float32, through the paged path), strict loading
of expert weights, the grouped expert path's invariances, and the CPU routes' half-precision dtypes."""
from __future__ import annotations

import json
import os
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from gh200rt.config import ModelConfig
from gh200rt.loader import ModelLoadError, load_model
from gh200rt.models.layers.moe_experts import grouped_experts, route
from tests.model.paged_runner import PagedRunner
from tests.model.test_parity_tiny import assert_chunked_prefill_matches_one_shot, assert_matches_transformers, prompt
from tests.model.tiny_checkpoints import MOE_FAMILIES, checkpoint_fixture, save_tiny

# which layers are sparse in each tiny family (4 layers)
SPARSE_LAYERS = {"qwen3-moe-norm": [0, 1, 2, 3], "qwen3-moe-sparse-step": [1], "qwen2-moe-shared": [0, 2, 3],
                 "mixtral": [0, 1, 2, 3]}


moe_checkpoint = checkpoint_fixture(MOE_FAMILIES)


def test_fp32_logits_and_greedy_match_transformers(moe_checkpoint):
    family, path, hf = moe_checkpoint
    loaded = load_model(ModelConfig(model=path, dtype="float32"))
    assert loaded.arch.moe_layers == SPARSE_LAYERS[family]
    assert_matches_transformers(hf, loaded.model, family)


def test_chunked_prefill_matches_one_shot(moe_checkpoint):
    family, path, _ = moe_checkpoint
    assert_chunked_prefill_matches_one_shot(path, family)


@pytest.mark.parametrize("dtype,tolerance,share", [("bfloat16", 4e-2, 0.8), ("float16", 1e-2, 1.0)])
def test_half_precision_routes_close_to_fp32(tmp_path, dtype, tolerance, share):
    """bf16 rounding flips the router's top-k choice for a few tokens of a random model (whose router
    probabilities sit close together), and a flipped expert moves that token's logits far: ``share`` of the
    positions must be within ``tolerance``."""
    hf = save_tiny("qwen2-moe-shared", str(tmp_path))
    loaded = load_model(ModelConfig(model=str(tmp_path), dtype=dtype))
    assert loaded.model.layers[0].mlp.experts[0].gate_up_proj.weight_ref.current.dtype == getattr(torch, dtype)
    ids = prompt(3)
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0].float()
    ours = PagedRunner(loaded.model, block_size=8, num_blocks=20).prefill(ids)
    per_position = (ours - ref).abs().amax(dim=-1) / ref.abs().max()
    within = float((per_position <= tolerance).float().mean())
    print(f"{dtype}: {within:.0%} of positions within {tolerance}; worst {float(per_position.max()):.3g}")
    assert within >= share, f"{dtype}: only {within:.0%} of positions within {tolerance}"


# ---- the grouped expert path ----------------------------------------------------------------------
def _experts(num: int, hidden: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    mats = [torch.randn(hidden, hidden, generator=g) for _ in range(num)]
    return lambda e, rows: torch.tanh(rows @ mats[e].T)


@pytest.mark.parametrize("scale_fp32", [False, True])
def test_grouped_experts_equal_per_token_sum_and_ignore_batch_order(scale_fp32):
    g = torch.Generator().manual_seed(1)
    tokens, hidden, num, k = 37, 16, 6, 3
    x = torch.randn(tokens, hidden, generator=g)
    weights, ids = route(torch.randn(tokens, num, generator=g), k, renormalize=True)
    expert = _experts(num, hidden)
    out = grouped_experts(x, weights, ids, num, expert, scale_fp32)
    naive = torch.stack([sum(weights[t, j] * expert(int(ids[t, j]), x[t:t + 1])[0] for j in range(k))
                         for t in range(tokens)])
    worst = float((out - naive).abs().max())
    print(f"grouped vs per-token sum: worst abs error {worst:.3g}")
    assert worst < 1e-5
    perm = torch.randperm(tokens, generator=g)
    shuffled = grouped_experts(x[perm], weights[perm], ids[perm], num, expert, scale_fp32)
    assert torch.equal(shuffled, out[perm]), "a token's output depends on the batch order"
    # alone, the token's expert GEMMs have one row, which the matmul library may round differently
    one = grouped_experts(x[5:6], weights[5:6], ids[5:6], num, expert, scale_fp32)
    assert float((one[0] - out[5]).abs().max()) < 1e-6


def test_route_renormalizes_and_breaks_ties_to_the_lower_expert():
    logits = torch.tensor([[0.0, 2.0, 2.0, 1.0]])
    weights, ids = route(logits, 2, renormalize=True)
    assert ids.tolist() == [[1, 2]] and torch.allclose(weights, torch.tensor([[0.5, 0.5]]))
    weights, _ = route(logits, 2, renormalize=False)
    assert float(weights.sum()) < 1


# ---- strict loading ---------------------------------------------------------------------------------
def _variant(good: str, tmp_path, edit) -> str:
    path = str(tmp_path / "variant")
    shutil.copytree(good, path)
    file = os.path.join(path, "model.safetensors")
    tensors = load_file(file)
    edit(tensors)
    save_file(tensors, file, metadata={"format": "pt"})
    return path


@pytest.fixture(scope="module")
def qwen2_moe_dir(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("qwen2moe"))
    save_tiny("qwen2-moe-shared", path)
    return path


def test_missing_expert_weight_is_named_and_its_fused_weight_partly_merged(qwen2_moe_dir, tmp_path):
    path = _variant(qwen2_moe_dir, tmp_path, lambda t: t.pop("model.layers.2.mlp.experts.5.up_proj.weight"))
    with pytest.raises(ModelLoadError, match=r"missing weights: model\.layers\.2\.mlp\.experts\.5\.up_proj\.weight"
                                             r".*partly merged.*model\.layers\.2\.mlp\.experts\.5\.gate_up_proj"):
        load_model(ModelConfig(model=path, dtype="float32"))


def test_missing_router_and_shared_expert_gate_are_named(qwen2_moe_dir, tmp_path):
    def drop(t):
        t.pop("model.layers.0.mlp.gate.weight")
        t.pop("model.layers.3.mlp.shared_expert_gate.weight")
    with pytest.raises(ModelLoadError, match=r"model\.layers\.0\.mlp\.gate\.weight.*"
                                             r"model\.layers\.3\.mlp\.shared_expert_gate\.weight"):
        load_model(ModelConfig(model=_variant(qwen2_moe_dir, tmp_path, drop), dtype="float32"))


def test_unexpected_expert_weight_is_named(qwen2_moe_dir, tmp_path):
    """An expert beyond config.json's num_experts, and experts in a layer mlp_only_layers makes dense."""
    def add(t):
        t["model.layers.0.mlp.experts.8.gate_proj.weight"] = torch.zeros(32, 64)
        t["model.layers.1.mlp.experts.0.down_proj.weight"] = torch.zeros(64, 32)
    with pytest.raises(ModelLoadError, match=r"unexpected weights .*model\.layers\.0\.mlp\.experts\.8\.gate_proj"
                                             r"\.weight, model\.layers\.1\.mlp\.experts\.0\.down_proj\.weight"):
        load_model(ModelConfig(model=_variant(qwen2_moe_dir, tmp_path, add), dtype="float32"))


def test_missing_moe_config_field_is_named(qwen2_moe_dir, tmp_path):
    path = str(tmp_path / "noexperts")
    shutil.copytree(qwen2_moe_dir, path)
    with open(os.path.join(path, "config.json")) as f:
        cfg = json.load(f)
    del cfg["moe_intermediate_size"]
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f)
    with pytest.raises(ModelLoadError, match="lacks the field 'moe_intermediate_size'"):
        load_model(ModelConfig(model=path, dtype="float32"))
