"""GLM-4.5 (``glm4_moe``) against transformers on tiny random checkpoints, float32, through the paged path: RoPE over
half of each head, q/k/v bias, with and without the q/k norm, DeepSeek-V3's router; and its published config."""
from __future__ import annotations

import json

import torch

from gh200rt.config import EngineConfig, ModelConfig
from gh200rt.engine.engine import LLMEngine
from gh200rt.engine.llm import LLM
from gh200rt.loader import load_model
from gh200rt.models.arch_config import ArchConfig
from gh200rt.plan import main
from gh200rt.sampling_params import SamplingParams
from tests.model.test_parity_tiny import assert_chunked_prefill_matches_one_shot, assert_matches_transformers, prompt
from tests.model.tiny_checkpoints import GLM_FAMILIES, checkpoint_fixture

GLM45 = "tests/fixtures/glm45"


glm_checkpoint = checkpoint_fixture(GLM_FAMILIES)


def test_fp32_logits_and_greedy_match_transformers(glm_checkpoint):
    family, path, hf = glm_checkpoint
    loaded = load_model(ModelConfig(model=path, dtype="float32"))
    assert loaded.arch.rotary_dim == 16 and loaded.arch.head_dim == 32 and loaded.arch.moe_layers == [1, 2]
    assert_matches_transformers(hf, loaded.model, family)


def test_chunked_prefill_matches_one_shot(glm_checkpoint):
    family, path, _ = glm_checkpoint
    assert_chunked_prefill_matches_one_shot(path, family)


def test_the_engine_on_the_native_kernels_gives_transformers_greedy_tokens(glm_checkpoint):
    """The engine's CPU kernels (the dense first layer's one-call decode layer and the fused RoPE + store + attention
    step rotate whole heads, so a partly rotated layer runs op by op) with experts resident and read in place."""
    family, path, hf = glm_checkpoint
    prompts = [prompt(1)[:20], prompt(2)[:13]]
    with torch.no_grad():
        want = [hf.generate(torch.tensor([ids]), max_new_tokens=8, do_sample=False, eos_token_id=None,
                            pad_token_id=0)[0, len(ids):].tolist() for ids in prompts]
    for options in (dict(offload="none"), dict(offload="none", moe_expert_tier="direct")):
        config = EngineConfig.from_kwargs(model=path, dtype="float32", max_model_len=64, num_kv_blocks=32, **options)
        engine = LLMEngine.from_config(config, poison=True)
        try:
            got = [o.outputs[0].token_ids for o in LLM.from_engine(engine).generate(
                prompts, SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))]
        finally:
            engine.close()
        assert got == want, (family, options)


def test_the_published_glm45_config_and_its_plan(capsys):
    with open(f"{GLM45}/config.json") as f:
        arch = ArchConfig.from_hf_config(json.load(f))
    assert (arch.rotary_dim, arch.head_dim, arch.qk_norm, arch.attention_bias) == (64, 128, True, True)
    assert arch.moe_layers == list(range(3, 92)) and arch.num_experts == 160 and arch.num_nextn_predict_layers == 1
    assert main(["--model", GLM45, "--platform", "gh200-144g", "--host-weight-dtype", "int4-g128"]) == 0
    out = capsys.readouterr().out
    assert "at 376832 bytes per token" in out and "routed experts:" in out
    assert main(["--model", GLM45, "--platform", "h100-sxm", "--host-weight-dtype", "int4-g128"]) == 0
    assert "streamed" in capsys.readouterr().out
