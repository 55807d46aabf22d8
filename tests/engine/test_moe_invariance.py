"""Acceptance 2 on MoE models (DeepSeek-V3's latent attention too): greedy outputs do not depend on batching,
preemption, prefix caching or chunked prefill, though batching changes which tokens share an expert's GEMM
(models/layers/moe_experts.py)."""
import pytest
import torch

from gh200rt.config import EngineConfig
from gh200rt.engine.engine import LLMEngine
from gh200rt.engine.llm import LLM
from gh200rt.sampling_params import SamplingParams
from tests.engine.real_models import SharedModel
from tests.engine.route_engines import describe_difference, first_step_logits
from tests.engine.test_invariance import check_invariance
from tests.model.test_parity_tiny import prompt
from tests.model.tiny_checkpoints import VOCAB, save_tiny


@pytest.mark.parametrize("family", ["qwen3-moe-norm", "qwen2-moe-shared", "deepseek-v3"])
def test_invariance_tiny_random_moe(tmp_path, family):
    path = str(tmp_path / family)
    save_tiny(family, path)
    check_invariance(SharedModel(path, "gh200rt"), vocab=VOCAB, max_tokens=16, small_pool=12)


@pytest.mark.parametrize("family", ["qwen2-moe-shared", "deepseek-v3", "glm4-moe-qk-norm"])
def test_a_prompts_bits_do_not_depend_on_its_chunks(tmp_path, family):
    """A prompt's first-token logits, bit for bit, prefilled at once and in chunks of 7 tokens on the fp32 route:
    the sigmoids of a shared expert's gate and of DeepSeek's router score each row alike in a step of any size."""
    path = str(tmp_path / family)
    save_tiny(family, path)
    params = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)
    ids = prompt(4)[:45]

    def first_logits(**options):
        config = EngineConfig.from_kwargs(model=path, max_model_len=64, num_kv_blocks=16, offload="none",
                                          cpu_route="fp32", enable_prefix_caching=False, **options)
        llm = LLM.from_engine(LLMEngine.from_config(config))
        try:
            return first_step_logits(llm, ids, params)
        finally:
            llm.engine.close()
    want_tokens, want = first_logits()
    got_tokens, got = first_logits(max_num_batched_tokens=7)
    assert torch.equal(got, want), f"{family}: {describe_difference(got, want)}"
    assert got_tokens == want_tokens
