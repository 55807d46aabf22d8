"""--async-scheduling with speculative decoding (engine/stepping.py): the next step is drafted and launched once a
step's tokens are taken in, before the step is reported (the text of sequences without stop strings and every
output are made while the next step runs). Every stop is decided at take-in, so the steps are the synchronous
engine's, and so are the outputs, bit for bit, for every method: tokens, text, logprobs, finish and stop reasons."""
from __future__ import annotations

import pytest

from gh200rt.sampling_params import SamplingParams
from tests.engine.real_models import SharedModel
from tests.engine.test_async_scheduling import assert_no_blocks_held, choices, finish, stepped
from tests.speculative.eagle3_files import write_eagle3_head
from tests.speculative.test_spec_engine import looping_prompts


@pytest.fixture(scope="module")
def methods(target_path, tmp_path_factory):
    head = write_eagle3_head(str(tmp_path_factory.mktemp("spec-async-head") / "head"))
    return {
        "ngram": {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 3},
        "suffix": {"method": "suffix", "num_speculative_tokens": 4},
        # the target drafting for itself keeps (nearly) every draft: steps that take in several tokens each
        "draft_model": {"method": "draft_model", "model": target_path, "num_speculative_tokens": 3},
        "eagle3": {"method": "eagle3", "model": head, "num_speculative_tokens": 3},
    }


def mixed_params(target: SharedModel, prompts) -> list[SamplingParams]:
    """Greedy with logprobs, seeded sampling, n = 2, a stop string and a stop token id found in plain outputs."""
    plain = target.llm(max_model_len=128).generate(prompts, SamplingParams(temperature=0, max_tokens=16,
                                                                           ignore_eos=True))
    return [SamplingParams(temperature=0, max_tokens=20, ignore_eos=True, logprobs=3),
            SamplingParams(temperature=0.8, top_p=0.9, seed=5, max_tokens=16, ignore_eos=True),
            SamplingParams(n=2, temperature=1.0, top_k=20, seed=3, max_tokens=12, ignore_eos=True, logprobs=1),
            SamplingParams(temperature=0, max_tokens=20, ignore_eos=True, stop=[plain[3].outputs[0].text[5:9]]),
            SamplingParams(temperature=0, max_tokens=20, stop_token_ids=[plain[4].outputs[0].token_ids[6]])]


@pytest.mark.parametrize("method", ["ngram", "suffix", "draft_model", "eagle3"])
def test_each_method_reports_the_synchronous_outputs(target, methods, method):
    prompts = looping_prompts(5, seed=21)
    params = mixed_params(target, prompts)
    options = {"max_model_len": 128, "num_kv_blocks": 64, "speculative_config": methods[method]}
    want = target.llm(**options).generate(prompts, params)
    llm = target.llm(async_scheduling=True, **options)
    got = llm.generate(prompts, params)
    assert choices(got) == choices(want)
    assert got[3].outputs[0].finish_reason == "stop" and got[3].outputs[0].stop_reason is not None
    assert llm.engine.async_scheduling == "report"
    stats = llm.engine.stats()
    assert stats.steps_launched_ahead >= 5, stats.steps_launched_ahead
    assert stats.rows_discarded == 0           # every stop is known before the next step is launched
    assert llm.engine.speculator.stats.num_draft_tokens > 0
    if method != "eagle3":                     # a random head keeps nothing
        assert llm.engine.speculator.stats.num_accepted_tokens > 0
    assert_no_blocks_held(llm.engine)


@pytest.mark.parametrize("options", [{"num_kv_blocks": 12, "block_size": 8, "max_model_len": 64},
                                     {"max_num_batched_tokens": 8, "max_model_len": 128}],
                         ids=["preempting", "chunked"])
def test_preemption_and_chunked_prompts(target, methods, options):
    prompts = looping_prompts(6, seed=10)
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, logprobs=1)
    for method in ("ngram", "draft_model"):
        spec = {**options, "speculative_config": methods[method]}
        want = target.llm(**spec).generate(prompts, params)
        llm = target.llm(async_scheduling=True, **spec)
        assert choices(llm.generate(prompts, params)) == choices(want), method
        if "num_kv_blocks" in options:
            assert llm.engine.stats().num_preemptions > 0
        assert_no_blocks_held(llm.engine)


def test_an_abort_while_the_next_step_is_in_flight_frees_its_blocks(target, methods):
    """A request aborted between two calls has a verifying step in flight: its rows are dropped when that step is
    taken in, its blocks are free at once, and the other requests get what they get without it
    (``--batch-invariant``: the synchronous engine's steps no longer hold its rows)."""
    prompts = looping_prompts(3, seed=30)
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    requests = {f"r{i}": (prompt, params) for i, prompt in enumerate(prompts)}
    options = {"max_model_len": 128, "num_kv_blocks": 64, "batch_invariant": True,
               "speculative_config": methods["draft_model"]}
    finals = {}
    for asked in (False, True):
        engine = stepped(target.llm(async_scheduling=asked, **options).engine, requests, steps=2)
        if asked:
            assert engine._in_flight is not None and any(s.group_id == "r2" for s in engine._in_flight.sampling)
        engine.abort("r2")
        finals[asked] = finish(engine)
        assert set(finals[asked]) == {"r0", "r1"}
        assert_no_blocks_held(engine)
    assert engine.stats().rows_discarded > 0
    assert [finals[True][r].outputs[0].token_ids for r in ("r0", "r1")] == \
        [finals[False][r].outputs[0].token_ids for r in ("r0", "r1")]
