"""The fp8 KV cache through the engine on the CPU: the pool stores fp8 and holds 4x the float32
tokens in the same budget, --calculate-kv-scales sets each layer's scales once from the first
batch, and generation stays close to the float32 cache."""
import pytest
import torch

from gh200rt.config import CacheConfig, EngineConfig
from gh200rt.engine.engine import LLMEngine
from gh200rt.engine.llm import LLM
from gh200rt.models.layers.attention import SelfAttention
from gh200rt.sampling_params import SamplingParams
from tests.engine.real_models import save_tiny_llama

PROMPTS = [[5, 9, 13, 17, 21, 25], [40, 41], list(range(60, 90))]
PARAMS = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logprobs=1)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return save_tiny_llama(str(tmp_path_factory.mktemp("tiny-kv-fp8")))


def engine(model: str, **options) -> LLMEngine:
    config = EngineConfig.from_kwargs(model=model, dtype="float32", max_model_len=128,
                                      device_memory_budget="8MiB", **options)
    return LLMEngine.from_config(config)


def scales(eng: LLMEngine) -> list[torch.Tensor]:
    return [m.kv_scale.clone() for m in eng.runner.model.modules() if isinstance(m, SelfAttention)]


def test_fp8_pool_holds_four_times_the_float32_tokens(tiny):
    fp32, fp8 = engine(tiny), engine(tiny, kv_cache_dtype="fp8")
    assert fp8.runner.kv_caches[0].dtype == torch.float8_e4m3fn
    assert engine(tiny, kv_cache_dtype="fp8_e5m2").runner.kv_caches[0].dtype == torch.float8_e5m2
    blocks32, blocks8 = fp32.plan.num_kv_blocks, fp8.plan.num_kv_blocks
    assert 3.98 * blocks32 <= blocks8 <= 4.02 * blocks32 + 4, (blocks32, blocks8)
    # the device arena (KV blocks and resident weight runs) is booked once, in fp8 KV blocks
    arena = fp8.store.arena
    assert fp8.ledger.by_kind["kv_pool"] + fp8.ledger.by_kind["arena_weights"] == arena.nbytes
    assert arena.block_bytes == 2 * 2 * 16 * 2 * 16  # layers x K,V x block_size x kv_heads x head_dim, 1 byte


def test_calculated_scales_are_set_once_from_the_first_batch(tiny):
    eng = engine(tiny, kv_cache_dtype="fp8", calculate_kv_scales=True)
    assert all(torch.equal(s, torch.ones(2)) for s in scales(eng))
    llm = LLM.from_engine(eng)
    llm.generate(PROMPTS[:1], PARAMS)
    first = scales(eng)
    assert all((s != 1.0).all() and (s > 0).all() for s in first)
    llm.generate(PROMPTS, PARAMS)  # larger K/V later saturate; the scales never move
    assert all(torch.equal(a, b) for a, b in zip(first, scales(eng)))


@pytest.mark.parametrize("options", [dict(kv_cache_dtype="fp8"), dict(kv_cache_dtype="fp8", calculate_kv_scales=True),
                                     dict(kv_cache_dtype="fp8_e5m2")], ids=str)
def test_fp8_cache_generates_close_to_float32(tiny, options):
    want = LLM.from_engine(engine(tiny)).generate(PROMPTS, PARAMS)
    got = LLM.from_engine(engine(tiny, **options)).generate(PROMPTS, PARAMS)
    same = sum(a.outputs[0].token_ids == b.outputs[0].token_ids for a, b in zip(want, got))
    first = [abs(a.outputs[0].cumulative_logprob - b.outputs[0].cumulative_logprob) for a, b in zip(want, got)]
    print(f"{options}: {same}/{len(PROMPTS)} identical greedy outputs; cumulative logprob differences {first}")
    assert same >= 2


def test_bad_kv_cache_flags_say_what_to_do():
    with pytest.raises(ValueError, match="add --kv-cache-dtype fp8"):
        CacheConfig(calculate_kv_scales=True)
    with pytest.raises(ValueError, match="choose one of auto, fp8, fp8_e4m3, fp8_e5m2"):
        CacheConfig(kv_cache_dtype="int8")
