"""DeepSeek-V3 (Kimi-K2's shape, DeepSeek-V2's routers) against transformers on tiny random checkpoints, float32,
through the paged path: latent attention in its absorbed form against the expanded one, DeepSeekMoE's routing op for
op, and strict loading of what these checkpoints carry."""
from __future__ import annotations

import json
import logging
import os
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from gh200rt.config import ModelConfig
from gh200rt.loader import ModelLoadError, load_model
from gh200rt.models.arch_config import ArchConfig
from gh200rt.models.layers.mla import LatentAttention, expanded_attention
from gh200rt.models.layers.moe_experts import route_grouped, row_stable_sigmoid
from tests.model.paged_runner import PagedRunner
from tests.model.test_parity_tiny import (assert_chunked_prefill_matches_one_shot, assert_matches_transformers, prompt,
                                          relative_error)
from tests.model.tiny_checkpoints import DEEPSEEK_FAMILIES, checkpoint_fixture, save_tiny

deepseek_checkpoint = checkpoint_fixture(DEEPSEEK_FAMILIES)


def test_fp32_logits_and_greedy_match_transformers(deepseek_checkpoint):
    family, path, hf = deepseek_checkpoint
    loaded = load_model(ModelConfig(model=path, dtype="float32"))
    arch = loaded.arch
    assert arch.is_mla and arch.kv_cache_dim == 32 + 16 and arch.kv_planes == 1
    assert arch.moe_layers == [1, 2], "first_k_dense_replace=1: layer 0 dense, the rest routed"
    assert_matches_transformers(hf, loaded.model, family)


def test_chunked_prefill_matches_one_shot(deepseek_checkpoint):
    family, path, _ = deepseek_checkpoint
    assert_chunked_prefill_matches_one_shot(path, family)


def test_absorbed_attention_equals_the_expanded_form(deepseek_checkpoint):
    """One layer's attention over a cached prefix and new tokens: the paged absorbed form (one latent row per
    token) against per-head K and V materialised."""
    family, path, _ = deepseek_checkpoint
    model = load_model(ModelConfig(model=path, dtype="float32")).model
    attn = model.layers[1].self_attn
    assert isinstance(attn, LatentAttention)
    g = torch.Generator().manual_seed(3)
    hidden = torch.randn(29, model.arch.hidden_size, generator=g)
    positions = torch.arange(29)
    cos, sin = model.rotary.tables(positions, torch.float32)
    runner = PagedRunner(model, block_size=4, num_blocks=16)
    from gh200rt.models.base import AttentionMetadata
    table = runner.table[:8]
    outs = []
    for start, stop in ((0, 20), (20, 29)):   # a prompt, then a chunk after its cached prefix
        meta = AttentionMetadata.build([stop - start], [stop], [table], 4)
        outs.append(attn(hidden[start:stop], cos[start:stop], sin[start:stop], meta, runner.caches[1]))
    absorbed = torch.cat(outs)
    first, latent = expanded_attention(attn, hidden[:20], cos[:20], sin[:20])
    second, _ = expanded_attention(attn, hidden[20:], cos[20:], sin[20:], latent)
    expanded = torch.cat((first, second))
    err = relative_error(absorbed, expanded)
    print(f"{family}: absorbed vs expanded worst relative error {err:.3g}")
    assert err <= 1e-5, f"{family}: absorbed attention differs from the expanded form by {err:.3g}"


@pytest.mark.parametrize("n_group,topk_group,top_k,renormalize", [(4, 2, 3, True), (1, 1, 4, False), (8, 3, 2, True)])
def test_grouped_routing_matches_transformers_router(n_group, topk_group, top_k, renormalize):
    from transformers import DeepseekV3Config
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3TopkRouter
    experts, hidden = 16, 24
    config = DeepseekV3Config(hidden_size=hidden, n_routed_experts=experts, n_group=n_group, topk_group=topk_group,
                              num_experts_per_tok=top_k, norm_topk_prob=renormalize, routed_scaling_factor=2.5)
    router = DeepseekV3TopkRouter(config)
    g = torch.Generator().manual_seed(n_group)
    with torch.no_grad():
        router.weight.normal_(0, 0.5, generator=g)
        router.e_score_correction_bias.normal_(0, 0.2, generator=g)
    x = torch.randn(40, hidden, generator=g)
    with torch.no_grad():
        logits, want_weights, want_ids = router(x)
    weights, ids = route_grouped(x @ router.weight.T, router.e_score_correction_bias, top_k, n_group, topk_group,
                                 renormalize, 2.5)
    order, want_order = ids.argsort(dim=1), want_ids.argsort(dim=1)
    assert torch.equal(ids.gather(1, order), want_ids.gather(1, want_order))
    torch.testing.assert_close(weights.gather(1, order), want_weights.gather(1, want_order), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("experts", [8, 256, 384])
def test_a_rows_sigmoid_scores_do_not_depend_on_the_rows_beside_it(experts):
    """torch's CPU sigmoid rounds a tensor's tail otherwise than its body: the routing scores of a token must not
    depend on how many tokens share its step (a prompt split in chunks), so each row's bits are its own."""
    g = torch.Generator().manual_seed(experts)
    logits = torch.randn(45, experts, generator=g) * 4
    together = row_stable_sigmoid(logits)
    for rows in ((0, 1), (3, 10), (10, 17), (17, 45)):
        assert torch.equal(row_stable_sigmoid(logits[rows[0]:rows[1]]), together[rows[0]:rows[1]]), rows
    torch.testing.assert_close(together, torch.sigmoid(logits), rtol=2e-7, atol=0)


# ---- strict loading ---------------------------------------------------------------------------------
def _copy(src: str, dst) -> str:
    shutil.copytree(src, dst)
    return str(dst)


def _edit_config(path: str, **fields) -> None:
    with open(os.path.join(path, "config.json")) as f:
        config = json.load(f)
    config.update(fields)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f)


def _edit_tensors(path: str, edit) -> None:
    file = os.path.join(path, "model.safetensors")
    tensors = load_file(file)
    edit(tensors)
    save_file(tensors, file, metadata={"format": "pt"})


@pytest.fixture(scope="module")
def v3_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("deepseek-v3-strict")
    save_tiny("deepseek-v3", str(path))
    return str(path)


def test_a_missing_expert_is_named(v3_path, tmp_path):
    path = _copy(v3_path, tmp_path / "m")
    _edit_tensors(path, lambda t: t.pop("model.layers.2.mlp.experts.5.down_proj.weight"))
    with pytest.raises(ModelLoadError, match=r"missing weights: model\.layers\.2\.mlp\.experts\.5\.down_proj\.weight"):
        load_model(ModelConfig(model=path, dtype="float32"))


def test_a_missing_correction_bias_is_named(v3_path, tmp_path):
    path = _copy(v3_path, tmp_path / "m")
    _edit_tensors(path, lambda t: t.pop("model.layers.1.mlp.gate.e_score_correction_bias"))
    with pytest.raises(ModelLoadError, match=r"model\.layers\.1\.mlp\.gate\.e_score_correction_bias"):
        load_model(ModelConfig(model=path, dtype="float32"))


def test_a_latent_projection_of_the_wrong_shape_is_named(v3_path, tmp_path):
    path = _copy(v3_path, tmp_path / "m")

    def narrow(t):
        name = "model.layers.0.self_attn.kv_b_proj.weight"
        t[name] = t[name][:, :16].contiguous()
    _edit_tensors(path, narrow)
    with pytest.raises(ModelLoadError, match=r"kv_b_proj\.weight has shape \(224, 16\) but the model config needs "
                                             r"\(224, 32\)"):
        load_model(ModelConfig(model=path, dtype="float32"))


@pytest.mark.parametrize("field,value,message", [
    ("scoring_func", "softmax", "scoring_func 'softmax' is not supported for deepseek_v3"),
    ("topk_method", "greedy", "topk_method 'greedy' is not supported"),
    ("n_group", 3, "n_group 3 / topk_group 2 do not fit 8 experts"),
])
def test_unsupported_routing_is_refused_with_the_value(v3_path, tmp_path, field, value, message):
    path = _copy(v3_path, tmp_path / "m")
    _edit_config(path, **{field: value})
    with pytest.raises(ModelLoadError, match=message):
        load_model(ModelConfig(model=path, dtype="float32"))


def test_the_mtp_layer_is_loaded_past_with_a_log_line(v3_path, tmp_path, caplog):
    """A published checkpoint ships its multi-token-prediction layer as model.layers.<num_hidden_layers>: read
    past and said so; a tensor of a layer beyond it is still unexpected."""
    path = _copy(v3_path, tmp_path / "m")

    def add_mtp(t):
        for name in [n for n in t if n.startswith("model.layers.2.")]:
            t[name.replace("model.layers.2.", "model.layers.3.")] = t[name].clone()
        t["model.layers.3.eh_proj.weight"] = torch.zeros(64, 128)
    _edit_tensors(path, add_mtp)
    _edit_config(path, num_nextn_predict_layers=1)
    with caplog.at_level(logging.INFO, logger="gh200rt.loader.weight_writer"):
        loaded = load_model(ModelConfig(model=path, dtype="float32"))
    assert loaded.arch.num_nextn_predict_layers == 1 and len(loaded.model.layers) == 3
    assert any("multi-token-prediction layer (model.layers.3)" in r.getMessage() for r in caplog.records)
    _edit_tensors(path, lambda t: t.update({"model.layers.4.eh_proj.weight": torch.zeros(2, 2)}))
    with pytest.raises(ModelLoadError, match=r"unexpected weights the model does not use: model\.layers\.4\."):
        load_model(ModelConfig(model=path, dtype="float32"))


def test_the_correction_bias_keeps_float32_in_a_bf16_model(v3_path):
    """Routing compares biased scores that differ in the third digit: the bias is not rounded to the model's bf16."""
    loaded = load_model(ModelConfig(model=v3_path, dtype="bfloat16"))
    stored = load_file(os.path.join(v3_path, "model.safetensors"))["model.layers.1.mlp.gate.e_score_correction_bias"]
    bias = loaded.model.layers[1].mlp.correction_bias
    assert bias.dtype == torch.float32 and torch.equal(bias, stored.float())


def test_arch_config_of_the_published_v3_config():
    """DeepSeek-V3's published config.json fields (no weights): the KV pool holds 576 values per token and layer,
    one plane; the first three layers are dense."""
    cfg = {"model_type": "deepseek_v3", "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048,
           "num_hidden_layers": 61, "num_attention_heads": 128, "num_key_value_heads": 128, "n_shared_experts": 1,
           "n_routed_experts": 256, "routed_scaling_factor": 2.5, "kv_lora_rank": 512, "q_lora_rank": 1536,
           "qk_rope_head_dim": 64, "v_head_dim": 128, "qk_nope_head_dim": 128, "n_group": 8, "topk_group": 4,
           "num_experts_per_tok": 8, "first_k_dense_replace": 3, "norm_topk_prob": True, "scoring_func": "sigmoid",
           "topk_method": "noaux_tc", "vocab_size": 129280, "max_position_embeddings": 163840,
           "num_nextn_predict_layers": 1, "moe_layer_freq": 1, "rope_theta": 10000,
           "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
                            "original_max_position_embeddings": 4096, "type": "yarn"}}
    arch = ArchConfig.from_hf_config(cfg)
    assert (arch.kv_cache_dim, arch.kv_cache_heads, arch.kv_planes) == (576, 1, 1)
    assert arch.moe_layers == list(range(3, 61)) and arch.shared_expert_intermediate_size == 2048
    assert arch.rope_scaling["rope_type"] == "yarn" and arch.num_nextn_predict_layers == 1
