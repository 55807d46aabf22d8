"""The CPU routes through the engine: which weight form each placement gets, and the int8 route with bf16
activations computing the same bits streamed (slots poisoned before every copy) as direct."""
import pytest
import torch

from gh200rt.config import EngineConfig
from gh200rt.engine.engine import LLMEngine
from gh200rt.engine.llm import LLM
from gh200rt.kernels.quant import PackedWeight
from gh200rt.models.layers.cpu_prepack import OneDNNWeight, linear_formats
from gh200rt.platform.cpu_features import route_for
from gh200rt.sampling_params import SamplingParams
from tests.engine.real_models import save_tiny_llama

PROMPTS = [[5, 9, 13, 17], [40, 41], list(range(60, 90))]
PARAMS = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, logprobs=3)
needs_onednn_bf16 = pytest.mark.skipif(route_for("bfloat16").linear_format is None,
                                       reason="oneDNN cannot run bf16 on this CPU")


def engine(model: str, **options) -> LLMEngine:
    config = EngineConfig.from_kwargs(model=model, max_model_len=128, **options)
    return LLMEngine.from_config(config, poison=True)


def run(eng: LLMEngine):
    outs = LLM.from_engine(eng).generate(PROMPTS, PARAMS)
    return [(o.outputs[0].token_ids, [sorted(lp.items()) for lp in o.outputs[0].logprobs]) for o in outs]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return save_tiny_llama(str(tmp_path_factory.mktemp("tiny") / "tiny"), num_layers=4)


def test_float32_keeps_dense_weights(tiny):
    eng = engine(tiny, dtype="float32")
    assert linear_formats(eng.runner.model) == {"dense float32": 17}
    eng.close()


@needs_onednn_bf16
def test_bf16_resident_layers_are_reordered_streamed_ones_are_not(tiny):
    eng = engine(tiny, dtype="bfloat16", offload="none", layer_tiers="1-2:streamed", staging_slots=1,
                 prefetch_distance=0)
    model = eng.runner.model
    assert all(isinstance(r.current, OneDNNWeight) for i in (0, 3) for r in model.layer_weight_refs(i).values())
    assert all(isinstance(r.current, torch.Tensor) for i in (1, 2) for r in model.layer_weight_refs(i).values())
    assert isinstance(model.lm_head.weight_ref.current, OneDNNWeight)
    tokens = [t for t, _ in run(eng)]
    assert all(len(t) == 6 for t in tokens)
    eng.close()


@needs_onednn_bf16
def test_int8_with_bf16_activations_streamed_equals_direct(tiny):
    direct = engine(tiny, dtype="bfloat16", offload="direct", host_weight_dtype="int8")
    streamed = engine(tiny, dtype="bfloat16", offload="stream", staging_slots=2, prefetch_distance=1,
                      host_weight_dtype="int8")
    refs = list(direct.runner.model.layer_weight_refs(0).values())
    assert all(isinstance(r.current, PackedWeight) and r.current.fmt == "int8" for r in refs)
    assert isinstance(direct.runner.model.lm_head.weight_ref.current, OneDNNWeight)
    want = run(direct)
    assert run(streamed) == want
    for eng in (direct, streamed):
        eng.close()
