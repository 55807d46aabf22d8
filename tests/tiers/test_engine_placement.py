"""Tiers through the engine (acceptance 1, 2, 3 and 5 on CPU): ``LLM(..., offload=...)`` places the real
loaded weights, the ledger holds every device byte to the budget, and every placement generates exactly
what all-resident generates (staging slots are poisoned with NaN before each copy)."""
import pytest

from gh200rt.config import EngineConfig
from gh200rt.engine.bootstrap import load_and_place
from gh200rt.engine.engine import LLMEngine
from gh200rt.engine.llm import LLM
from gh200rt.numa.alloc import where
from gh200rt.planner.planner import PlanDoesNotFit
from gh200rt.sampling_params import SamplingParams
from tests.engine.real_models import save_tiny_llama

LAYERS = 6
PROMPTS = [[5, 9, 13, 17], [40, 41], list(range(60, 90))]
PARAMS = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logprobs=3)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return save_tiny_llama(str(tmp_path_factory.mktemp("tiny6")), num_layers=LAYERS)


def engine(model: str, **options) -> LLMEngine:
    config = EngineConfig.from_kwargs(model=model, dtype="float32", **{"max_model_len": 128, **options})
    return LLMEngine.from_config(config, poison=True)


def run(eng: LLMEngine, prompts=PROMPTS, params=PARAMS):
    outs = LLM.from_engine(eng).generate(prompts, params)
    return [(o.outputs[0].token_ids, [sorted(lp.items()) for lp in o.outputs[0].logprobs]) for o in outs]


EVERY_2ND = ",".join(f"{i}:streamed" for i in range(1, LAYERS, 2))
EVERY_3RD = ",".join(f"{i}:streamed" for i in range(2, LAYERS, 3))
PLACEMENTS = {
    "stream K1 d0": dict(offload="stream", staging_slots=1, prefetch_distance=0),
    "stream K2 d1": dict(offload="stream", staging_slots=2, prefetch_distance=1),
    "stream K3 d1": dict(offload="stream", staging_slots=3, prefetch_distance=1),
    "stream K3 d2": dict(offload="stream", staging_slots=3, prefetch_distance=2),
    "every 2nd streamed": dict(offload="none", layer_tiers=EVERY_2ND, staging_slots=2, prefetch_distance=1),
    "every 3rd streamed": dict(offload="none", layer_tiers=EVERY_3RD, staging_slots=2, prefetch_distance=1),
    "direct": dict(offload="direct"),
    "direct + streamed": dict(offload="direct", layer_tiers="0-2:streamed", staging_slots=2, prefetch_distance=1),
}


@pytest.mark.parametrize("label", PLACEMENTS)
def test_tiny_llama_placements_are_bit_identical(tiny_dir, label):
    reference = run(engine(tiny_dir, offload="none"))
    eng = engine(tiny_dir, **PLACEMENTS[label])
    assert run(eng) == reference, label
    tiers = eng.stats().layers_per_tier
    assert tiers["resident"] < LAYERS
    if tiers["streamed"]:
        assert eng.stats().weight_bytes_copied > 0
    eng.close()


@pytest.mark.parametrize("label", ["stream K1 d0", "stream K3 d2", "every 3rd streamed", "direct + streamed"])
def test_smollm2_placements_are_bit_identical(label, short_smollm2):
    """SmolLM2's shapes and Q4_1 / Q8_0 weights (its first four blocks: the fixture) placed as the tiny Llama's."""
    memory = dict(PLACEMENTS[label])
    if label == "every 3rd streamed":
        memory["layer_tiers"] = "0:streamed,3:streamed"
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True, logprobs=3)
    prompts = [[1, 504, 3458, 314], [2, 77, 1000, 5000, 42]]
    reference = run(engine(short_smollm2, offload="none"), prompts, params)
    assert run(engine(short_smollm2, **memory), prompts, params) == reference


def test_budget_below_all_resident_streams_within_budget_and_grows_kv(tiny_dir):
    resident = load_and_place(EngineConfig.from_kwargs(model=tiny_dir, dtype="float32", max_model_len=128,
                                                    offload="none"))
    needed = resident.ledger.used - resident.ledger.by_kind["kv_pool"]  # weights + activations, all resident
    layer = resident.plan.sizes.layer_bytes
    block = resident.plan.sizes.kv_bytes_per_token * 16
    budget = needed + 12 * block - 3 * layer  # all-resident would not even fit its weights and one sequence
    all_resident_blocks = max(0, (budget - needed) // block)
    eng = engine(tiny_dir, device_memory_budget=str(budget))
    tiers = eng.stats().layers_per_tier
    assert tiers["streamed"] >= 3 and tiers["resident"] + tiers["streamed"] == LAYERS
    assert eng.ledger.peak <= eng.ledger.capacity == budget
    assert eng.kv.pool.num_blocks >= 8 > all_resident_blocks  # 8 blocks: one 128-token sequence
    assert run(eng) == run(engine(tiny_dir, offload="none"))
    eng.close()


def test_budget_too_small_names_the_minimum_that_works(tiny_dir):
    with pytest.raises(PlanDoesNotFit, match="smallest plan") as info:
        engine(tiny_dir, device_memory_budget="64KiB")
    minimum = int(str(info.value).split("needs ")[-1].split(" bytes")[0])
    eng = engine(tiny_dir, device_memory_budget=str(minimum), offload="stream", staging_slots=1,
                 prefetch_distance=0)
    assert eng.ledger.peak <= minimum
    eng.close()


def test_host_slabs_exact_size_on_the_chosen_node(tiny_dir):
    placed = load_and_place(EngineConfig.from_kwargs(model=tiny_dir, dtype="float32", max_model_len=128,
                                                  offload="direct"))
    offloaded = LAYERS * sum(ref.current.nbytes for ref in placed.loaded.model.layer_weight_refs(0).values())
    assert offloaded <= placed.store.host_slab_bytes() <= 1.02 * offloaded
    for slab in placed.store.slabs.values():
        pages = where(slab.buffer)
        assert set(pages) == {placed.platform.host_numa_node}, pages


@pytest.mark.parametrize("fmt", ["bf16", "int8", "int4", "fp8"])
def test_host_weight_formats_streamed_equals_direct(tiny_dir, fmt):
    direct = engine(tiny_dir, offload="direct", host_weight_dtype=fmt)
    streamed = engine(tiny_dir, offload="stream", staging_slots=2, prefetch_distance=1, host_weight_dtype=fmt)
    assert run(direct) == run(streamed)
    slab = next(iter(streamed.store.slabs.values())).nbytes
    dense = sum(ref.current.nbytes for ref in engine(tiny_dir, offload="none").runner.model.layer_weight_refs(0)
                .values())
    assert slab < dense * {"bf16": 0.51, "int8": 0.27, "int4": 0.2, "fp8": 0.27}[fmt]
    streamed.close()


def test_gguf_int4_host_weights_keep_the_checkpoint_blocks(short_smollm2):
    """SmolLM2's Q4_1 blocks imported as int4 host weights compute what the dequantized fp32 model does, to the
    native linear's int16 activations: rounded per 32 columns to their largest value / 32767, which SmolLM2's
    outlier channels make coarse for their neighbours. Against a float64 reference of the same file (transformers)
    the fp32 route's logprobs are within 1e-5 and the int4 decode steps' up to 1.1e-3 (an AMX Xeon, and the same
    with its native ops built for AVX2 only)."""
    prompts, params = [[1, 504, 3458, 314]], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True, logprobs=3)
    reference = run(engine(short_smollm2, offload="none"), prompts, params)
    packed = engine(short_smollm2, offload="direct", host_weight_dtype="int4")
    got = run(packed, prompts, params)
    assert got[0][0] == reference[0][0]
    for ref_step, got_step in zip(reference[0][1], got[0][1]):
        for (tok_a, lp_a), (tok_b, lp_b) in zip(ref_step, got_step):
            assert tok_a == tok_b and abs(lp_a.logprob - lp_b.logprob) < 3e-3


def test_engine_options_reach_the_plan(tiny_dir):
    eng = engine(tiny_dir, offload="none", layer_tiers="1:direct,3-4:streamed", staging_slots=2,
                 prefetch_distance=1)
    assert eng.plan.tiers == ("resident", "direct", "resident", "streamed", "streamed", "resident")
    pool = eng.kv.pool
    assert eng.plan.num_kv_blocks == pool.num_blocks - pool.num_run_blocks == eng.stats().kv_blocks_total
    assert eng.plan.arena_weight_blocks == pool.num_run_blocks
    text = eng.plan.explain()
    assert "streamed" in text and "direct" in text and f"{eng.plan.num_kv_blocks} blocks" in text
    assert f"device arena: {pool.num_blocks} blocks" in text
    gh200_profile = engine(tiny_dir, platform="gh200-96g", offload="direct")  # plans for a GH200, runs here
    assert gh200_profile.plan.platform.kind == "gh200" and run(gh200_profile) == run(eng)
    with pytest.raises(ValueError, match="--max-model-len 4096 exceeds"):
        engine(tiny_dir, max_model_len=4096)
    eng.close()
