"""Engine mechanics on a one-layer toy model (milliseconds); the real-model acceptance tests are
test_invariance.py, test_seeded.py and test_no_leaks.py."""
import random

import pytest

from gh200rt.config import EngineConfig
from gh200rt.engine.engine import LLMEngine
from gh200rt.engine.llm import LLM
from gh200rt.sampling_params import SamplingParams
from tests.engine.toy_model import ToyArch, ToyModel, ToyTokenizer


def make_llm(**kw):
    arch = ToyArch()
    cfg = EngineConfig.from_kwargs(**{"num_kv_blocks": 64, "block_size": 4, **kw})
    return LLM.from_engine(LLMEngine(ToyModel(arch), ToyTokenizer(), arch, cfg))


def prompts(n=12, seed=0):
    rng = random.Random(seed)
    shared = [rng.randrange(1, 64) for _ in range(13)]
    return [(shared if i % 3 == 0 else []) + [rng.randrange(1, 64) for _ in range(rng.randrange(1, 20))]
            for i in range(n)]


GREEDY = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)


def test_batched_preempted_cached_chunked_runs_match_one_at_a_time():
    ps = prompts()
    ref_llm = make_llm()
    reference = [ref_llm.generate([p], GREEDY)[0].token_ids for p in ps]
    for kw in ({}, {"enable_prefix_caching": False}, {"max_num_batched_tokens": 3},
               {"num_kv_blocks": 12, "max_model_len": 48}):
        llm = make_llm(**kw)
        got = [o.token_ids for o in llm.generate(ps, GREEDY)]
        assert got == reference, kw
        if kw.get("num_kv_blocks") == 12:
            assert llm.engine.stats().num_preemptions > 0


def test_prompt_positions_keep_their_bits_after_a_cached_prefix_and_in_chunks():
    """The toy keeps the engine's prefix-cache invariance as the real models do (a BLAS call's row bits depend on
    its row count: a prompt whose last token is all that is left after the cache would otherwise differ)."""
    sampled = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True, logprobs=2)
    scored = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True, prompt_logprobs=1)   # reads no cache

    def run(llm, prompt, params=sampled):
        out = llm.generate([prompt], params)[0]
        return out.outputs[0].token_ids, out.outputs[0].logprobs, out.prompt_logprobs

    for prompt in ([5, 17, 33, 2, 9, 41, 8, 60], [5, 17, 33, 2, 9, 41, 8, 60, 12, 3, 7]):
        reference = run(make_llm(enable_prefix_caching=False), prompt)
        cached = make_llm()
        assert run(cached, prompt) == reference
        hits = cached.engine.stats().prefix_cache_hit_tokens
        assert run(cached, prompt) == reference                 # all but the last token from the prefix cache
        assert cached.engine.stats().prefix_cache_hit_tokens - hits >= len(prompt) - 4
        assert run(make_llm(max_num_batched_tokens=3), prompt) == reference
        scores = run(make_llm(), prompt, scored)
        assert run(make_llm(max_num_batched_tokens=3), prompt, scored) == scores


def test_n_choices_share_prompt_blocks_and_seeded_choices_differ():
    llm = make_llm()
    p = SamplingParams(n=3, temperature=1.0, seed=3, max_tokens=6, ignore_eos=True)
    out = llm.generate([list(range(1, 10))], p)[0]
    assert [c.index for c in out.outputs] == [0, 1, 2]
    assert all(len(c.token_ids) == 6 and c.finish_reason == "length" for c in out.outputs)
    assert len({tuple(c.token_ids) for c in out.outputs}) > 1
    again = llm.generate([list(range(1, 10))], p)[0]
    assert [c.token_ids for c in again.outputs] == [c.token_ids for c in out.outputs]


def test_streaming_deltas_add_up_and_finish_once():
    llm = make_llm()
    eng = llm.engine
    eng.add_request("r", None, SamplingParams(temperature=0, max_tokens=5, ignore_eos=True),
                    prompt_token_ids=[1, 2, 3])
    pieces, reasons = [], []
    while eng.has_unfinished_requests():
        for o in eng.step():
            pieces.append(o.outputs[0].delta_text)
            reasons.append(o.outputs[0].finish_reason)
    assert "".join(pieces) == o.outputs[0].text and len(o.outputs[0].token_ids) == 5
    assert reasons == [None] * 4 + ["length"]


def test_add_request_validation_names_the_problem():
    eng = make_llm(max_model_len=32).engine
    with pytest.raises(ValueError, match="empty"):
        eng.add_request("a", None, SamplingParams(), prompt_token_ids=[])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        eng.add_request("b", None, SamplingParams(), prompt_token_ids=[1, 999])
    with pytest.raises(ValueError, match="exceed max_model_len 32"):
        eng.add_request("c", None, SamplingParams(max_tokens=30), prompt_token_ids=[1, 2, 3])


def test_prompt_logprobs_cover_every_prompt_token_after_the_first():
    llm = make_llm(max_num_batched_tokens=4)
    out = llm.generate([[5, 6, 7, 8, 9, 10]], SamplingParams(temperature=0, max_tokens=2, prompt_logprobs=2,
                                                             logprobs=1, ignore_eos=True))[0]
    assert out.prompt_logprobs[0] is None and len(out.prompt_logprobs) == 6
    assert all(t in lp for t, lp in zip([6, 7, 8, 9, 10], out.prompt_logprobs[1:]))
    assert len(out.outputs[0].logprobs) == 2
    again = llm.generate([[5, 6, 7, 8, 9, 10]], SamplingParams(temperature=0, max_tokens=2, prompt_logprobs=2))[0]
    assert len(again.prompt_logprobs) == 6        # a warm prefix cache must not swallow prompt positions


def test_kv_pool_too_small_for_one_sequence_is_a_clear_error():
    with pytest.raises(ValueError, match="--num-kv-blocks"):
        make_llm(num_kv_blocks=2, max_model_len=64)


def test_out_of_vocabulary_stop_token_ids_are_refused_up_front():
    llm = make_llm()
    with pytest.raises(ValueError, match="stop_token_ids"):
        llm.engine.add_request("oov", None, SamplingParams(stop_token_ids=[10**6], min_tokens=1), prompt_token_ids=[5])
    assert not llm.engine.has_unfinished_requests()


def test_untokenizable_prompt_is_a_value_error(short_smollm2):
    from tests.engine.real_models import SharedModel  # a real tokenizers.Tokenizer
    llm = SharedModel(short_smollm2).llm(max_model_len=64, num_kv_blocks=8)
    with pytest.raises(ValueError, match="cannot be tokenized"):
        llm.engine.add_request("surrogate", "\ud800", SamplingParams())


def test_max_logprobs_bounds_requests_and_minus_one_is_the_whole_vocabulary():
    with pytest.raises(ValueError, match="--max-logprobs"):
        make_llm().engine.add_request("big", None, SamplingParams(logprobs=21), prompt_token_ids=[5])
    with pytest.raises(ValueError, match="--max-logprobs"):
        make_llm().engine.add_request("all", None, SamplingParams(prompt_logprobs=-1), prompt_token_ids=[5])
    out = make_llm(max_logprobs=64).generate([[5, 6]], SamplingParams(temperature=0, max_tokens=2, logprobs=-1,
                                                                      prompt_logprobs=-1))[0]
    assert all(len(entry) == 64 for entry in out.outputs[0].logprobs)
    assert len(out.prompt_logprobs[1]) == 64
    assert len(make_llm(max_logprobs=-1).generate([[5]], SamplingParams(max_tokens=1, logprobs=-1))[0]
               .outputs[0].logprobs[0]) == 64


def test_allowed_and_pinned_token_ids_outside_the_vocabulary_are_refused():
    eng = make_llm().engine
    for name in ("allowed_token_ids", "logprob_token_ids"):
        with pytest.raises(ValueError, match=name):
            eng.add_request(name, None, SamplingParams(logprobs=0, **{name: [64]}), prompt_token_ids=[5])


def test_each_steps_output_keeps_that_steps_cumulative_text_ids_and_logprobs():
    # outputs are built from the sequence's growing lists (CompletionOutput.snapshot): one read after later steps
    # must still hold its own step's prefix, equal to the deltas so far, and the final one the whole output
    llm = make_llm()
    eng = llm.engine
    eng.add_request("r", None, SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, logprobs=2),
                    prompt_token_ids=[1, 2, 3])
    steps = []
    while eng.has_unfinished_requests():
        steps += [o.outputs[0] for o in eng.step()]
    assert len(steps) == 6
    for i, out in enumerate(steps):
        so_far = steps[:i + 1]
        assert out.token_ids == [t for o in so_far for t in o.delta_token_ids] and len(out.token_ids) == i + 1
        assert out.text == "".join(o.delta_text for o in so_far)
        assert out.logprobs == [lp for o in so_far for lp in o.delta_logprobs] and len(out.logprobs) == i + 1
    assert steps[2] != steps[3] and steps[-1] == steps[-1]
    assert "token_ids=[" in repr(steps[0]) and steps[0].finished is False and steps[-1].finished is True
