"""Speculative decoding on CUDA: n-gram and draft-model drafts verified on resident, streamed and direct weights give
greedy decoding's tokens (or first differ at a near tie: a verifying step takes the short-chunk attention kernel, a
decode the decode kernel); sampled requests run with seeds that repeat; drafts are kept."""
import pytest

from gh200rt.config import EngineConfig
from gh200rt.engine.engine import LLMEngine
from gh200rt.engine.llm import LLM
from gh200rt.sampling_params import SamplingParams
from tests.engine.real_models import assert_same_or_near_tie, save_tiny_llama
from tests.gpu.test_gpu_engine import tiny_dir  # noqa: F401  (the module's fixture)
from tests.speculative.test_spec_engine import NGRAM, looping_prompts

pytestmark = pytest.mark.gpu
PLACEMENTS = {"resident graphs": dict(offload="none"),
              "stream K2 d1": dict(offload="stream", staging_slots=2, prefetch_distance=1),
              "direct int4": dict(offload="direct", host_weight_dtype="int4")}


@pytest.fixture(scope="module")
def draft_dir(tmp_path_factory):
    return save_tiny_llama(str(tmp_path_factory.mktemp("draft-gpu")), num_layers=1)


def run(model_dir: str, prompts, params, **options):
    config = EngineConfig.from_kwargs(model=model_dir, dtype="float32", max_model_len=128, num_kv_blocks=64,
                                      **options)
    engine = LLMEngine.from_config(config, poison=True)
    try:
        assert engine.runner.device == "cuda"
        return LLM.from_engine(engine).generate(prompts, params), engine.stats().spec_decode
    finally:
        engine.close()


@pytest.mark.parametrize("label", PLACEMENTS)
@pytest.mark.parametrize("method", ["ngram", "draft_model"])
def test_verified_drafts_give_greedy_tokens_on_cuda(tiny_dir, draft_dir, label, method):  # noqa: F811
    prompts = looping_prompts(4, seed=13)
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, logprobs=2)
    reference, _ = run(tiny_dir, prompts, params, **PLACEMENTS[label])
    spec = NGRAM if method == "ngram" else {"method": "draft_model", "model": draft_dir, "num_speculative_tokens": 3}
    outputs, stats = run(tiny_dir, prompts, params, speculative_config=spec, **PLACEMENTS[label])
    assert_same_or_near_tie(reference, outputs, f"{method}, {label}")
    assert stats.num_draft_tokens > 0, stats


def test_sampled_requests_with_seeds_repeat_on_cuda(tiny_dir, draft_dir):  # noqa: F811
    params = SamplingParams(temperature=0.8, top_p=0.95, max_tokens=12, ignore_eos=True, n=2, seed=5)
    spec = {"method": "draft_model", "model": draft_dir, "num_speculative_tokens": 3}
    first, _ = run(tiny_dir, looping_prompts(2, seed=14), params, speculative_config=spec)
    again, stats = run(tiny_dir, looping_prompts(2, seed=14), params, speculative_config=spec)
    assert [[c.token_ids for c in o.outputs] for o in first] == [[c.token_ids for c in o.outputs] for o in again]
    assert stats.num_draft_tokens > 0


def test_verifying_steps_replay_decode_graphs_on_cuda(tiny_dir):  # noqa: F811
    """A step that verifies drafts replays the graph of its rows' bucket (a row per position)."""
    prompts = looping_prompts(3, seed=15)
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, logprobs=2)
    reference, _ = run(tiny_dir, prompts, params, max_num_seqs=8)
    config = EngineConfig.from_kwargs(model=tiny_dir, dtype="float32", max_model_len=128, num_kv_blocks=64,
                                      max_num_seqs=8, speculative_config=NGRAM)
    engine = LLMEngine.from_config(config, poison=True)
    try:
        outputs = LLM.from_engine(engine).generate(prompts, params)
        assert engine.graphs is not None and max(engine.graphs.graphs) > len(prompts), sorted(engine.graphs.graphs)
        assert engine.stats().spec_decode.num_accepted_tokens > 0
    finally:
        engine.close()
    assert_same_or_near_tie(reference, outputs, "ngram verified in graphs")


def test_an_eagle3_head_keeps_greedy_tokens_on_cuda(tiny_dir, tmp_path):  # noqa: F811
    from tests.speculative.eagle3_files import write_eagle3_head
    head = write_eagle3_head(str(tmp_path / "head"), aux_ids=[0, 1, 1])
    prompts = looping_prompts(3, seed=16)
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=2)
    reference, _ = run(tiny_dir, prompts, params)
    outputs, stats = run(tiny_dir, prompts, params,
                         speculative_config={"method": "eagle3", "model": head, "num_speculative_tokens": 3})
    assert_same_or_near_tie(reference, outputs, "eagle3 on cuda")
    assert stats.num_draft_tokens > 0, stats


@pytest.mark.parametrize("label", ["resident graphs", "stream K2 d1"])
def test_async_scheduling_reports_the_synchronous_outputs_on_cuda(tiny_dir, draft_dir, label):  # noqa: F811
    """With --async-scheduling (a GPU's default) the next verifying step is launched before a step is reported;
    every stop is decided before that launch, so the steps and their outputs are the synchronous engine's, bit for
    bit (greedy with logprobs, seeded n = 2, a stop token)."""
    prompts = looping_prompts(3, seed=16)
    params = [SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, logprobs=2),
              SamplingParams(temperature=0.8, top_p=0.95, max_tokens=12, ignore_eos=True, n=2, seed=5),
              SamplingParams(temperature=0, max_tokens=16, stop_token_ids=[7])]
    spec = {"method": "draft_model", "model": draft_dir, "num_speculative_tokens": 3}
    results = {}
    for asked in (False, True):
        config = EngineConfig.from_kwargs(model=tiny_dir, dtype="float32", max_model_len=128, num_kv_blocks=64,
                                          speculative_config=spec, async_scheduling=asked, **PLACEMENTS[label])
        engine = LLMEngine.from_config(config, poison=True)
        try:
            outputs = LLM.from_engine(engine).generate(prompts, params)
            results[asked] = [[(c.token_ids, c.text, c.finish_reason, c.cumulative_logprob) for c in o.outputs]
                              for o in outputs]
            stats = engine.stats()
        finally:
            engine.close()
        assert (stats.steps_launched_ahead > 0) == asked and stats.rows_discarded == 0, stats
        assert stats.spec_decode.num_draft_tokens > 0
    assert results[True] == results[False]
