"""The whole engine on a GPU: ``LLMEngine.from_config`` plans, places and runs each tier on CUDA and
generates what all-resident generates (greedy; a differing token must be a near tie, as on CPU)."""
import pytest

from gh200rt.config import EngineConfig
from gh200rt.engine.engine import LLMEngine
from gh200rt.engine.llm import LLM
from gh200rt.sampling_params import SamplingParams
from tests.engine.real_models import assert_same_or_near_tie, save_tiny_llama

pytestmark = pytest.mark.gpu
PROMPTS = [[5, 9, 13, 17], [40, 41], list(range(60, 90))]
PLACEMENTS = {
    "stream K2 d1": dict(offload="stream", staging_slots=2, prefetch_distance=1),
    "every 2nd streamed": dict(offload="none", layer_tiers="1:streamed,3:streamed,5:streamed", staging_slots=2,
                               prefetch_distance=1),
    "direct": dict(offload="direct"),
    "direct int8": dict(offload="direct", host_weight_dtype="int8"),
    "stream int4": dict(offload="stream", staging_slots=2, prefetch_distance=1, host_weight_dtype="int4"),
    "direct fp8": dict(offload="direct", host_weight_dtype="fp8"),
    "stream fp8": dict(offload="stream", staging_slots=2, prefetch_distance=1, host_weight_dtype="fp8"),
    "fp8 KV cache": dict(offload="stream", staging_slots=2, prefetch_distance=1, kv_cache_dtype="fp8",
                         calculate_kv_scales=True),
}


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return save_tiny_llama(str(tmp_path_factory.mktemp("tiny6-gpu")), num_layers=6)


GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logprobs=2)


def generate(model_dir: str, params=GREEDY, **options):
    """The engine of ``options`` on CUDA (staging slots NaN-filled before each copy), and its outputs for PROMPTS."""
    config = EngineConfig.from_kwargs(model=model_dir, dtype="float32", max_model_len=128, num_kv_blocks=64,
                                      **options)
    engine = LLMEngine.from_config(config, poison=True)
    assert engine.runner.device == "cuda"
    return engine, LLM.from_engine(engine).generate(PROMPTS, params)


@pytest.mark.parametrize("label", PLACEMENTS)
def test_gpu_placements_generate_what_all_resident_generates(tiny_dir, label):
    _, reference = generate(tiny_dir, offload="none")
    engine, outputs = generate(tiny_dir, **PLACEMENTS[label])
    if not any(q in label for q in ("int", "fp8")):  # quantized weights or KV change the numbers; dense must not
        assert_same_or_near_tie(reference, outputs, label)
    assert all(len(o.outputs[0].token_ids) == 8 for o in outputs)
    stats = engine.stats()
    assert stats.layers_per_tier["resident"] < 6
    if stats.layers_per_tier["streamed"]:
        assert stats.weight_bytes_copied > 0
    assert engine.ledger.peak <= engine.ledger.capacity
    engine.close()


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_direct_tier_reads_through_host_gemm_for_every_compute_dtype(tiny_dir, dtype, monkeypatch):
    from gh200rt.kernels.triton import host_gemm as host_gemm_module
    from gh200rt.weights.device_view import HostDenseWeight
    calls = []
    real = host_gemm_module.host_gemm
    monkeypatch.setattr(host_gemm_module, "host_gemm", lambda *a, **k: calls.append(1) or real(*a, **k))
    config = EngineConfig.from_kwargs(model=tiny_dir, dtype=dtype, max_model_len=128, num_kv_blocks=64,
                                      offload="direct", host_weight_dtype="bf16")
    engine = LLMEngine.from_config(config)
    refs = [ref for i in range(6) for ref in engine.runner.model.layer_weight_refs(i).values()]
    assert all(isinstance(ref.current, HostDenseWeight) for ref in refs), {type(r.current) for r in refs}
    outputs = LLM.from_engine(engine).generate(PROMPTS, SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    assert all(len(o.outputs[0].token_ids) == 4 for o in outputs)
    assert calls, "host_gemm must serve the direct tier"
    engine.close()


@pytest.mark.parametrize("ahead", [False, True], ids=["sync", "async-scheduling"])
def test_dynamic_tiers_on_a_gpu_move_layers_between_steps_and_keep_the_tokens(tiny_dir, ahead):
    """--offload dynamic on CUDA: layers flipped between steps (arena runs taken and given back, the ring
    booked up front, every address fixed) still generate what all-resident generates; with --async-scheduling
    each move first waits for the step launched ahead to run."""
    import random

    from gh200rt.engine.tier_controller import Move, TierController
    from gh200rt.weights.tiers import LAYER_TIERS, Tier
    _, reference = generate(tiny_dir, offload="none")
    config = EngineConfig.from_kwargs(model=tiny_dir, dtype="float32", max_model_len=128, num_kv_blocks=64,
                                      offload="dynamic", async_scheduling=ahead)
    engine = LLMEngine.from_config(config, poison=True)
    arena = engine.store.arena
    before = (arena.buffer.data_ptr(), [s.data_ptr() for s in engine.store.backend.slots])
    rng = random.Random(0)

    class Flip:
        def decide(self, signals):
            return Move(rng.randrange(6), rng.choice(list(LAYER_TIERS)), "test") if signals.step % 2 == 0 else None

    engine.controller = TierController(engine.store, Flip())
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logprobs=2)
    outputs = LLM.from_engine(engine).generate(PROMPTS, params)
    assert_same_or_near_tie(reference, outputs, "dynamic")
    assert sum(engine.controller.counts.values()) > 0
    assert (engine.stats().steps_launched_ahead > 0) == ahead
    assert (arena.buffer.data_ptr(), [s.data_ptr() for s in engine.store.backend.slots]) == before
    stats = engine.stats()
    assert stats.arena_weight_blocks + stats.kv_blocks_total == arena.num_blocks
    engine.close()


def test_fused_decode_rows_under_cuda_graphs_generate_what_op_by_op_layers_generate(tiny_dir):
    """``--fused-decode-rows 8`` in bf16: the graphs of buckets 1-8 capture the fused layers (kernels/triton/fused_rows.py)
    and generate the op-by-op layers' tokens (a differing token must be a near tie)."""
    options = dict(dtype="bfloat16", max_model_len=128, num_kv_blocks=64)
    outputs = {}
    for rows in (1, 8):
        engine = LLMEngine.from_config(EngineConfig.from_kwargs(model=tiny_dir, fused_decode_rows=rows, **options))
        assert engine.runner.graphs is not None
        outputs[rows] = LLM.from_engine(engine).generate(PROMPTS, GREEDY)
        engine.close()
    assert_same_or_near_tie(outputs[1], outputs[8], "fused decode rows 8")


def test_programmatic_dependent_launch_under_cuda_graphs_generates_the_same_tokens_and_logprobs(tiny_dir):
    """``--enable-pdl`` with the fused layers up to 8 rows, the decode graphs capturing the programmatic edges:
    the tokens and logprobs of ordinary launches, exactly (the same kernels compute the same values)."""
    import torch
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("programmatic dependent launch needs sm_90+")
    options = dict(dtype="bfloat16", max_model_len=128, num_kv_blocks=64, fused_decode_rows=8)
    outputs = {}
    for pdl in (False, True):
        engine = LLMEngine.from_config(EngineConfig.from_kwargs(model=tiny_dir, enable_pdl=pdl, **options))
        assert engine.runner.graphs is not None
        outputs[pdl] = LLM.from_engine(engine).generate(PROMPTS, GREEDY)
        engine.close()
    for plain, chained in zip(outputs[False], outputs[True]):
        assert chained.outputs[0].token_ids == plain.outputs[0].token_ids
        assert chained.outputs[0].logprobs == plain.outputs[0].logprobs
