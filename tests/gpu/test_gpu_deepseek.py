"""A tiny DeepSeek-V3 on CUDA: latent attention on the torch ops (no Triton MLA kernel yet) under the GPU engine,
decode graphs included, with experts resident, read in place and streamed: transformers' greedy tokens in float32
(or a first difference at a near tie)."""
import pytest
import torch

from gh200rt.config import EngineConfig
from gh200rt.engine.engine import LLMEngine
from gh200rt.engine.llm import LLM
from tests.engine.test_deepseek_engine import GREEDY, PROMPTS, v3  # noqa: F401  (the module's fixture)

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("label,options", [("resident", dict(offload="none")),
                                           ("experts direct", dict(offload="none", moe_expert_tier="direct")),
                                           ("experts streamed", dict(offload="none", moe_expert_tier="stream"))])
def test_greedy_tokens_equal_transformers_on_cuda(v3, label, options):  # noqa: F811
    path, want = v3
    config = EngineConfig.from_kwargs(model=path, dtype="float32", max_model_len=64, num_kv_blocks=64, **options)
    engine = LLMEngine.from_config(config, poison=True)
    try:
        assert engine.runner.device == "cuda" and torch.cuda.is_available()
        got = [o.outputs[0].token_ids for o in LLM.from_engine(engine).generate(PROMPTS, GREEDY)]
    finally:
        engine.close()
    first_difference = [next((i for i, (a, b) in enumerate(zip(g, w)) if a != b), None) for g, w in zip(got, want)]
    assert all(d is None or d >= 4 for d in first_difference), (label, got, want)
