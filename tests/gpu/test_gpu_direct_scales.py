"""DIRECT layers with their scales in device memory (--direct-scales device, the default on a GPU): the ledger
books exactly the plan's bytes, the scales sit in HBM while the codes stay in the host slab, the tokens are those of
the scales left on the host (same values, same kernel), and a tier move gives the bytes back."""
import pytest
import torch

from gh200rt.config import EngineConfig
from gh200rt.engine.engine import LLMEngine
from gh200rt.engine.llm import LLM
from gh200rt.formats.pack import PackedWeight
from gh200rt.sampling_params import SamplingParams
from tests.engine.real_models import save_tiny_llama

pytestmark = pytest.mark.gpu
PROMPTS = [[5, 9, 13, 17], [40, 41], list(range(60, 90))]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return save_tiny_llama(str(tmp_path_factory.mktemp("tiny4-scales")), num_layers=4)


def engine_for(model_dir: str, fmt: str, scales: str) -> LLMEngine:
    config = EngineConfig.from_kwargs(model=model_dir, dtype="bfloat16", max_model_len=128, num_kv_blocks=64,
                                      offload="direct", host_weight_dtype=fmt, direct_scales=scales)
    return LLMEngine.from_config(config)


def tokens(engine: LLMEngine) -> list[list[int]]:
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    return [o.outputs[0].token_ids for o in LLM.from_engine(engine).generate(PROMPTS, params)]


@pytest.mark.parametrize("fmt", ["int4", "int8", "fp8"])
def test_scales_in_hbm_generate_what_host_scales_generate(tiny_dir, fmt):
    on_host = engine_for(tiny_dir, fmt, "host")
    want = tokens(on_host)
    assert on_host.ledger.by_kind["direct_scales"] == 0
    on_host.close()
    engine = engine_for(tiny_dir, fmt, "device")
    assert engine.plan.direct_scales_on_device
    booked = engine.ledger.by_kind["direct_scales"]
    assert booked == engine.plan.direct_scale_bytes > 0
    packed = [ref.current for layer in range(4) for ref in engine.store.model.layer_weight_refs(layer).values()
              if isinstance(ref.current, PackedWeight)]
    assert packed, "the direct layers hold packed weights"
    for weight in packed:
        assert weight.scale.is_cuda and weight.qweight.is_cuda
        # the codes are the slab seen through its device mapping; the scales a separate HBM allocation
        assert weight.scale.untyped_storage().data_ptr() != weight.qweight.untyped_storage().data_ptr()
    assert tokens(engine) == want
    engine.store.set_tier(0, "streamed")
    assert engine.ledger.by_kind["direct_scales"] == booked * 3 // 4
    engine.store.set_tier(0, "direct")
    assert engine.ledger.by_kind["direct_scales"] == booked
    assert tokens(engine) == want
    engine.close()
    torch.cuda.synchronize()
