"""--async-scheduling on CUDA: steps launched before the previous step's tokens reach the host read those tokens on
the device (through the decode graphs' input buffer, or the eager step's inputs) and give the synchronous engine's
tokens and logprobs, resident and with streamed layers; the host copy of a step's results is issued at sampling
time, so reporting step N never waits for step N+1."""
import pytest

from gh200rt.config import EngineConfig
from gh200rt.engine.engine import LLMEngine
from gh200rt.engine.llm import LLM
from gh200rt.sampling_params import SamplingParams
from tests.gpu.test_gpu_engine import PROMPTS, generate, tiny_dir  # noqa: F401  (tiny_dir: the module's fixture)

pytestmark = pytest.mark.gpu
PARAMS = [SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=2),
          SamplingParams(temperature=0.9, top_p=0.9, seed=7, max_tokens=9, ignore_eos=True),
          SamplingParams(n=2, temperature=1.0, top_k=20, seed=11, max_tokens=10, ignore_eos=True)]
PLACEMENTS = {"resident graphs": dict(offload="none"),
              "resident eager": dict(offload="none", enforce_eager=True),
              "stream K2 d1": dict(offload="stream", staging_slots=2, prefetch_distance=1)}


def tokens(outputs):
    return [[(c.token_ids, c.cumulative_logprob) for c in o.outputs] for o in outputs]


@pytest.mark.parametrize("label", PLACEMENTS)
def test_steps_launched_ahead_on_cuda_give_the_synchronous_tokens(tiny_dir, label):  # noqa: F811
    sync_engine, reference = generate(tiny_dir, PARAMS, **PLACEMENTS[label])
    sync_engine.close()
    engine, outputs = generate(tiny_dir, PARAMS, async_scheduling=True, **PLACEMENTS[label])
    assert tokens(outputs) == tokens(reference)
    stats = engine.stats()
    assert stats.steps_launched_ahead >= 10 and stats.rows_discarded == 0, stats
    if "graphs" in label:
        assert stats.graph_captures > 0
    engine.close()


def test_launching_a_decode_step_ahead_never_waits_for_the_device(tiny_dir):  # noqa: F811
    """The overlap rests on this: filling the graph's inputs (the fed token ids copied on the device), the replay,
    the logits, the sampler and the results' copy to the host are all issued without a host-device sync (torch's
    sync debug mode raises on one). The second run's buckets are already captured: a capture synchronizes."""
    import torch
    config = EngineConfig.from_kwargs(model=tiny_dir, dtype="float32", max_model_len=128, num_kv_blocks=64,
                                      async_scheduling=True)
    engine = LLMEngine.from_config(config)
    llm = LLM.from_engine(engine)
    params = [SamplingParams(temperature=0, max_tokens=10, ignore_eos=True),
              SamplingParams(temperature=0.8, top_p=0.9, max_tokens=10, ignore_eos=True, logprobs=2)]
    llm.generate(PROMPTS[:2], params)
    launch_ahead, checked = engine._launch_ahead, []

    def without_syncs(current):
        torch.cuda.set_sync_debug_mode("error")
        try:
            launched = launch_ahead(current)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        checked.append(launched is not None)
        return launched
    engine._launch_ahead = without_syncs
    outputs = llm.generate(PROMPTS[:2], params)
    assert all(len(o.outputs[0].token_ids) == 10 for o in outputs)
    assert sum(checked) >= 8, checked
    engine.close()


def test_structured_output_on_cuda_samples_ahead_without_a_sync(tmp_path_factory):
    """A grammar row's step runs its model ahead and samples once the previous tokens are appended; that sampling
    (llguidance's mask copied from page-locked memory, the draw, the results' copy) issues no host-device sync,
    and the tokens are the synchronous engine's."""
    import torch

    from gh200rt.structured import Constraint
    from tests.server.byte_llama import save_byte_llama
    model_dir = save_byte_llama(str(tmp_path_factory.mktemp("byte-llama-async-gpu")))
    schema = {"type": "object", "additionalProperties": False, "required": ["k"],
              "properties": {"k": {"enum": ["alpha", "beta"]}, "v": {"type": "integer"}}}
    params = [SamplingParams(temperature=1.0, seed=3, max_tokens=40, structured_output=Constraint.json_schema(schema)),
              SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)]
    prompts = [[1, 5, 6, 7], [1, 8, 9]]
    results = {}
    for mode in (False, True):
        config = EngineConfig.from_kwargs(model=model_dir, dtype="float32", max_model_len=128, num_kv_blocks=64,
                                          async_scheduling=mode)
        engine = LLMEngine.from_config(config)
        llm = LLM.from_engine(engine)
        llm.generate(prompts, params)          # captures, first-call initialisations
        launch, calls = engine.sampler.launch, []

        def without_syncs(*args, **kwargs):
            torch.cuda.set_sync_debug_mode("error")
            try:
                return launch(*args, **kwargs)
            finally:
                torch.cuda.set_sync_debug_mode("default")
                calls.append(1)
        engine.sampler.launch = without_syncs
        results[mode] = [[c.token_ids for c in o.outputs] for o in llm.generate(prompts, params)]
        assert calls
        if mode:
            assert engine.stats().steps_launched_ahead >= 10
        engine.close()
    assert results[True] == results[False]
