"""The fp16 host format through the engine: streamed and direct placements compute the same bits from
the same fp16 bytes (the staging slots are poisoned before each copy), at half the fp32 slab size."""
from gh200rt.config import EngineConfig
from gh200rt.engine.engine import LLMEngine
from gh200rt.engine.llm import LLM
from gh200rt.formats.pack import HalfWeight
from gh200rt.sampling_params import SamplingParams
from tests.engine.real_models import save_tiny_llama

PROMPTS = [[5, 9, 13, 17], [40, 41], list(range(60, 90))]
PARAMS = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, logprobs=3)


def engine(model: str, **options) -> LLMEngine:
    config = EngineConfig.from_kwargs(model=model, dtype="float32", max_model_len=128, **options)
    return LLMEngine.from_config(config, poison=True)


def run(eng: LLMEngine):
    outs = LLM.from_engine(eng).generate(PROMPTS, PARAMS)
    return [(o.outputs[0].token_ids, [sorted(lp.items()) for lp in o.outputs[0].logprobs]) for o in outs]


def test_fp16_streamed_equals_direct_and_halves_the_slabs(tmp_path):
    model = save_tiny_llama(str(tmp_path / "tiny"), num_layers=4)
    direct = engine(model, offload="direct", host_weight_dtype="fp16")
    streamed = engine(model, offload="stream", staging_slots=2, prefetch_distance=1, host_weight_dtype="fp16")
    mixed = engine(model, offload="direct", layer_tiers="1-2:streamed", staging_slots=1, prefetch_distance=0,
                   host_weight_dtype="fp16")
    refs = streamed.runner.model.layer_weight_refs(0).values()
    assert all(isinstance(ref.current, HalfWeight) and not ref.current.stable for ref in refs)
    want = run(direct)
    assert run(streamed) == want and run(mixed) == want
    fp32 = engine(model, offload="direct")
    assert direct.store.host_slab_bytes() <= 0.51 * fp32.store.host_slab_bytes()
    for eng in (direct, streamed, mixed, fp32):
        eng.close()
