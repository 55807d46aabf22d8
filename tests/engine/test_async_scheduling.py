"""--async-scheduling (engine/run_ahead.py): steps launched before the previous step's tokens reach the host give the
tokens, logprobs, text and finish reasons of synchronous steps, on the eager and the bucketed decode path, and
fall back to synchronous steps wherever a launched-ahead step would differ from the one the scheduler takes next."""
import pytest

from gh200rt.sampling_params import SamplingParams
from tests.engine.real_models import SharedModel, save_tiny_llama

PROMPTS = [[5, 9, 13, 17], [40, 41], list(range(60, 90)), [7] * 11, [100, 3, 200, 4, 150]]
PATHS = {"eager": {"enforce_eager": True}, "bucketed": {"enforce_eager": False}}


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    return SharedModel(save_tiny_llama(str(tmp_path_factory.mktemp("tiny-async")), num_layers=2))


def run(shared, prompts, params, **options):
    llm = shared.llm(**{"max_model_len": 128, "num_kv_blocks": 64, "block_size": 4, **options})
    outputs = llm.generate(prompts, params)
    return llm.engine, outputs


def choices(outputs):
    return [[(c.token_ids, c.text, c.finish_reason, c.stop_reason, c.cumulative_logprob,
              [{t: (lp.logprob, lp.rank) for t, lp in d.items()} for d in c.logprobs or []]) for c in o.outputs]
            for o in outputs]


def assert_no_blocks_held(engine):
    assert engine.kv.pool.num_free == engine.kv.pool.num_blocks - engine.kv.pool.num_run_blocks
    assert engine._in_flight is None or all(s.is_finished for s in engine._in_flight.sampling)


def async_engine(shared, **options):
    return shared.llm(**{"max_model_len": 128, "num_kv_blocks": 64, "block_size": 4, "async_scheduling": True,
                         **options}).engine


def stepped(engine, requests: dict, steps: int):
    """``engine`` after adding ``requests`` (id -> (prompt, params)) and taking ``steps`` steps."""
    for request_id, (prompt, params) in requests.items():
        engine.add_request(request_id, None, params, prompt_token_ids=prompt)
    for _ in range(steps):
        engine.step()
    return engine


def finish(engine, check=None) -> dict:
    """Step ``engine`` until no request is left; each request's final output (``check``: called on every output)."""
    finals = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if check is not None:
                check(out)
            if out.finished:
                finals[out.request_id] = out
    return finals


@pytest.mark.parametrize("path", PATHS)
def test_greedy_seeded_and_logprob_requests_get_the_synchronous_results(shared, path):
    params = [SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=3),
              SamplingParams(temperature=0.9, top_p=0.9, seed=7, max_tokens=9, ignore_eos=True),
              SamplingParams(temperature=0, max_tokens=3, ignore_eos=True),
              SamplingParams(n=2, temperature=1.0, top_k=20, seed=11, max_tokens=10, ignore_eos=True, logprobs=1),
              SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)]
    _, reference = run(shared, PROMPTS, params, **PATHS[path])
    engine, outputs = run(shared, PROMPTS, params, async_scheduling=True, **PATHS[path])
    assert choices(outputs) == choices(reference)
    stats = engine.stats()
    # 11 decode steps after the first; the first decode step follows the prefill, whose sequences all sampled
    assert stats.steps_launched_ahead >= 10, stats.steps_launched_ahead
    assert stats.rows_discarded == 0          # length stops are known ahead: no row is computed in vain
    assert stats.generation_tokens == sum(len(c.token_ids) for o in outputs for c in o.outputs)
    assert_no_blocks_held(engine)


def test_stops_the_host_learns_late_cost_one_discarded_row_and_change_nothing(shared):
    """EOS, stop token ids and stop strings end a sequence one step after a step was launched for it: its row is
    dropped. Batch-invariant kernels make the other rows' bits independent of that extra row."""
    free = SamplingParams(temperature=0, max_tokens=16)
    _, plain = run(shared, PROMPTS, free, batch_invariant=True)
    stop_ids = [o.outputs[0].token_ids[3] for o in plain[:2]]
    text = plain[2].outputs[0].text
    stop_string = text[len(text) // 2:len(text) // 2 + 2]
    assert stop_string.strip(), text
    params = [SamplingParams(temperature=0, max_tokens=16, stop_token_ids=stop_ids),
              SamplingParams(temperature=0, max_tokens=16, stop_token_ids=stop_ids, include_stop_str_in_output=True),
              SamplingParams(temperature=0, max_tokens=16, stop=[stop_string]),
              SamplingParams(temperature=0, max_tokens=16),
              SamplingParams(temperature=0, max_tokens=16, stop=[stop_string], logprobs=2)]
    _, reference = run(shared, PROMPTS, params, batch_invariant=True)
    llm = shared.llm(max_model_len=128, num_kv_blocks=64, block_size=4, batch_invariant=True, async_scheduling=True)
    engine, calls, step = llm.engine, [], llm.engine.step
    engine.step = lambda: calls.append(1) or step()
    outputs = llm.generate(PROMPTS, params)
    assert choices(outputs) == choices(reference)
    reasons = [o.outputs[0].finish_reason for o in outputs]
    assert reasons.count("stop") >= 2, reasons
    stats = engine.stats()
    # a stop drops the row and the engine stays ahead: every call launched the next step, the last one's excepted
    assert stats.steps_launched_ahead >= len(calls) - 1, (stats.steps_launched_ahead, len(calls))
    assert stats.rows_discarded == reasons.count("stop")
    assert_no_blocks_held(engine)


def test_penalties_min_tokens_and_bad_words_see_the_token_in_flight(shared):
    """Penalties and min_tokens read the output so far: a step launched ahead counts the token in flight on the
    device. Bad words compare the output's tail on the host: that step's sampling waits until the tail is in.
    Either way the synchronous tokens come out. (PROMPTS[3] and [4] make this model repeat its last token, so a
    penalty that missed the token in flight would show.)"""
    plain = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    repeating = PROMPTS[3:5]
    counted = [SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, repetition_penalty=1.8),
               SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, repetition_penalty=1.8,
                              repetition_window=2),
               SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, frequency_penalty=1.5),
               SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, presence_penalty=2.0),
               SamplingParams(temperature=0.9, seed=5, max_tokens=8, ignore_eos=True, frequency_penalty=0.8)]
    for special in counted:
        _, reference = run(shared, repeating, special)
        engine, outputs = run(shared, repeating, special, async_scheduling=True)
        assert choices(outputs) == choices(reference), special
        assert engine.stats().steps_launched_ahead >= 6, special
    _, free = run(shared, PROMPTS[1:2], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
    first = free[0].outputs[0].token_ids
    assert first[6] not in first[:6]
    # the 7th token is the first one min_tokens allows to stop: counted one short, it would be banned once more
    at_least = SamplingParams(temperature=0, max_tokens=12, min_tokens=6, stop_token_ids=[first[6]])
    _, reference = run(shared, PROMPTS[:2], [plain, at_least])
    engine, outputs = run(shared, PROMPTS[:2], [plain, at_least], async_scheduling=True)
    assert choices(outputs) == choices(reference)
    assert reference[1].outputs[0].finish_reason == "stop" and len(reference[1].outputs[0].token_ids) == 7
    assert engine.stats().steps_launched_ahead >= 6
    # bad words read the output's tail on the host: the step's model runs ahead, its sampling once the tail is in
    _, free = run(shared, repeating[:1], plain)
    tail = shared.tokenizer.decode(free[0].outputs[0].token_ids[:2])
    bad = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, bad_words=[tail.strip()])
    _, reference = run(shared, repeating, [bad, plain])
    assert reference[0].outputs[0].token_ids != free[0].outputs[0].token_ids
    engine, outputs = run(shared, repeating, [bad, plain], async_scheduling=True)
    assert choices(outputs) == choices(reference)
    assert engine.stats().steps_launched_ahead >= 6


def test_a_request_added_while_a_step_is_in_flight_is_prefilled_in_the_step_launched_ahead(shared):
    """The synchronous scheduler admits waiting requests behind its running ones; a step launched ahead does too:
    the fed decodes first, then the new prompt (mixed steps run eagerly), and async steps go on after it."""
    greedy = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    engine = stepped(async_engine(shared), {"a": (PROMPTS[2], greedy)}, 3)
    assert engine.rows_in_flight == 1
    engine.add_request("b", None, greedy, prompt_token_ids=PROMPTS[1])
    launched = engine.steps_launched_ahead
    engine.step()                     # reports a's step in flight; launches a's next decode and b's prefill
    assert not engine.scheduler.waiting and engine.rows_in_flight == 2
    assert engine.steps_launched_ahead == launched + 1
    finals = finish(engine)
    assert engine.steps_launched_ahead >= 9
    _, reference = run(shared, [PROMPTS[2]], greedy)
    _, alone = run(shared, [PROMPTS[1]], greedy)
    assert choices([finals["a"], finals["b"]]) == choices([reference[0], alone[0]])
    assert_no_blocks_held(engine)


def test_a_prompt_prefilled_in_chunks_goes_on_in_the_steps_launched_ahead(shared):
    """After a chunk that does not end its prompt, the next step is still launched ahead: the prompt's next chunk
    comes from the host beside the decodes fed on the device, as the synchronous scheduler would take them."""
    greedy = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    long_prompt = list(range(100, 140))
    _, reference = run(shared, [PROMPTS[0], long_prompt], greedy, max_num_batched_tokens=16)
    engine = stepped(async_engine(shared, max_num_batched_tokens=16), {"a": (PROMPTS[0], greedy)}, 1)
    engine.add_request("b", None, greedy, prompt_token_ids=long_prompt)
    launch_ahead, after_chunk = engine._launch_ahead, []

    def recording(current):
        launched = launch_ahead(current)
        if len(current.sampling) < len(current.out.scheduled):      # a chunk that does not end its prompt
            after_chunk.append(launched)
        return launched
    engine._launch_ahead = recording
    finals = finish(engine)
    assert len(after_chunk) >= 2 and all(after_chunk), after_chunk   # 40 tokens in chunks of 16 less a's row
    assert choices([finals["a"], finals["b"]]) == choices(reference)
    assert engine.steps_launched_ahead > 0
    assert_no_blocks_held(engine)


def test_aborting_a_request_with_a_step_in_flight_frees_its_blocks_and_drops_its_row(shared):
    greedy = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    engine = stepped(async_engine(shared), {str(i): (p, greedy) for i, p in enumerate(PROMPTS[:3])}, 4)
    assert engine.rows_in_flight > 0
    engine.abort("1")

    def not_the_aborted(out):
        assert out.request_id != "1"
    finals = finish(engine, not_the_aborted)
    assert engine.rows_discarded == 1
    _, reference = run(shared, [PROMPTS[0], PROMPTS[2]], greedy)
    assert choices([finals["0"], finals["2"]]) == choices(reference)
    assert_no_blocks_held(engine)


def test_a_short_kv_pool_preempts_in_synchronous_steps_and_keeps_the_tokens(shared):
    greedy = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    _, reference = run(shared, PROMPTS, greedy)
    engine, outputs = run(shared, PROMPTS, greedy, num_kv_blocks=16, max_model_len=64, async_scheduling=True)
    assert [o.outputs[0].token_ids for o in outputs] == [o.outputs[0].token_ids for o in reference]
    stats = engine.stats()
    assert stats.num_preemptions > 0 and stats.steps_launched_ahead > 0
    assert_no_blocks_held(engine)


def test_decoded_blocks_computed_ahead_are_published_with_their_tokens(shared):
    """Batch-invariant CPU steps publish decoded blocks; a block whose last position a launched-ahead step computed
    is published once its token is known, and a prompt that extends a finished answer reuses every such block
    and gets the tokens a cold engine computes."""
    # 4 prompt tokens and 13 outputs: the last computed position, 15, ends block 3, and no step follows to publish it
    greedy = SamplingParams(temperature=0, max_tokens=13, ignore_eos=True)
    llm = shared.llm(max_model_len=128, num_kv_blocks=64, block_size=4, batch_invariant=True, async_scheduling=True)
    first = llm.generate([PROMPTS[0]], greedy)[0]
    follow = PROMPTS[0] + first.outputs[0].token_ids + [33, 34]
    warm = llm.generate([follow], greedy)[0]
    assert warm.num_cached_tokens == (len(follow) - 1) // 4 * 4
    cold = shared.llm(max_model_len=128, num_kv_blocks=64, block_size=4, batch_invariant=True,
                      enable_prefix_caching=False).generate([follow], greedy)[0]
    assert warm.outputs[0].token_ids == cold.outputs[0].token_ids
    assert llm.engine.stats().steps_launched_ahead > 0


def test_prompts_admitted_behind_rows_that_then_stop_are_still_completed(shared):
    """The step launched ahead holds a's decode and the first chunk of b's prompt; a stops on a stop token the
    step before, so its row is dropped, yet b's chunk (here pooled for a mean embedding, and a prompt's logprobs)
    must still be taken in."""
    from gh200rt.pooling_params import PoolingParams
    greedy = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    _, plain = run(shared, [PROMPTS[0]], greedy)
    stop_at = SamplingParams(temperature=0, max_tokens=10, stop_token_ids=[plain[0].outputs[0].token_ids[1]])
    long_prompt = list(range(100, 124))
    options = dict(max_model_len=128, num_kv_blocks=64, block_size=4, max_num_batched_tokens=8,
                   pooling_type="MEAN")
    scored = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True, prompt_logprobs=1)
    reference_embedding = shared.llm(**options).embed([long_prompt])[0].outputs.embedding
    reference_scores = shared.llm(**options).generate([long_prompt], scored)[0].prompt_logprobs
    for second in ("embed", "score"):
        # a's prefill, its first decode launched ahead; then b arrives
        engine = stepped(async_engine(shared, **options), {"a": (PROMPTS[0], stop_at)}, 1)
        engine.add_request("b", None, PoolingParams() if second == "embed" else scored, prompt_token_ids=long_prompt)
        finals = finish(engine)
        assert finals["a"].outputs[0].finish_reason == "stop" and engine.rows_discarded == 1
        if second == "embed":
            got = finals["b"].outputs.embedding
            assert max(abs(x - y) for x, y in zip(got, reference_embedding)) < 1e-5
        else:
            assert [{t: round(lp.logprob, 4) for t, lp in d.items()} if d else None
                    for d in finals["b"].prompt_logprobs] == \
                [{t: round(lp.logprob, 4) for t, lp in d.items()} if d else None for d in reference_scores]
        assert_no_blocks_held(engine)


def test_aborting_an_admitted_prompt_while_its_chunk_is_in_flight(shared):
    from gh200rt.pooling_params import PoolingParams
    greedy = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    scored = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True, prompt_logprobs=1)
    options = dict(max_model_len=128, num_kv_blocks=64, block_size=4, max_num_batched_tokens=8, pooling_type="MEAN")
    _, reference = run(shared, [PROMPTS[0]], greedy, **{k: v for k, v in options.items() if k != "pooling_type"})
    for params in (PoolingParams(), scored):
        engine = stepped(async_engine(shared, **options), {"a": (PROMPTS[0], greedy)}, 1)
        engine.add_request("b", None, params, prompt_token_ids=list(range(100, 124)))
        engine.step()                 # launches a's decode and b's first chunk ahead
        assert engine.rows_in_flight == 1 and not engine.scheduler.waiting
        engine.abort("b")
        finals = finish(engine)
        assert list(finals) == ["a"] and choices([finals["a"]]) == choices(reference)
        assert_no_blocks_held(engine)


def test_close_finishes_a_step_left_in_flight_by_aborted_requests(shared):
    greedy = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    engine = stepped(async_engine(shared), {str(i): (p, greedy) for i, p in enumerate(PROMPTS[:2])}, 3)
    engine.abort("0")
    engine.abort("1")
    assert not engine.has_unfinished_requests() and engine.rows_in_flight == 2
    engine.close()
    assert engine.rows_in_flight == 0


def test_structured_output_runs_ahead_with_its_mask_taken_once_the_token_is_in(tmp_path_factory):
    """A grammar's mask follows the output on the host: a step launched ahead runs its model at once and samples
    once the previous step's tokens are appended, so constrained requests get the synchronous tokens, valid JSON
    among them, beside unconstrained ones."""
    jsonschema = pytest.importorskip("jsonschema")
    import json

    from gh200rt.structured import Constraint
    from tests.server.byte_llama import save_byte_llama
    byte_model = SharedModel(save_byte_llama(str(tmp_path_factory.mktemp("byte-llama-async"))))
    schema = {"type": "object", "additionalProperties": False, "required": ["k", "v"], "properties": {
        "k": {"enum": ["alpha", "beta"]}, "v": {"type": "array", "maxItems": 3,
                                              "items": {"type": "integer", "minimum": 0, "maximum": 99}}}}
    constrained = [SamplingParams(temperature=1.0, seed=s, max_tokens=60, structured_output=Constraint.json_schema(schema))
                   for s in (3, 4)]
    free = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    prompts = [[1, 5, 6, 7], [1, 8, 9], [1, 10, 11, 12]]
    params = [constrained[0], free, constrained[1]]
    outputs = {}
    for mode in (False, True):
        llm = byte_model.llm(max_model_len=128, num_kv_blocks=64, block_size=4, async_scheduling=mode)
        outputs[mode] = llm.generate(prompts, params)
    assert choices(outputs[True]) == choices(outputs[False])
    for out in (outputs[True][0], outputs[True][2]):
        assert out.outputs[0].finish_reason == "stop", out.outputs[0].text
        jsonschema.validate(json.loads(out.outputs[0].text), schema)
    assert llm.engine.stats().steps_launched_ahead >= 10


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_workloads_give_the_synchronous_tokens(shared, seed):
    """Requests arriving at random steps with every kind of parameter (greedy and seeded draws, penalties,
    min_tokens, stop ids and strings, logprobs, n=2), random aborts, prompts chunked by a small token budget and
    preempted by a small KV pool: with batch-invariant steps every request that is not aborted gets the same
    tokens, text and logprobs with async scheduling as without, though the two schedules differ."""
    import random
    rng = random.Random(seed)
    vocab = shared.arch.vocab_size

    def params():
        kind = rng.randrange(7)
        common = dict(max_tokens=rng.randrange(1, 14), logprobs=rng.choice([None, 2]))
        if kind == 0:
            return SamplingParams(temperature=0, ignore_eos=True, **common)
        if kind == 1:
            return SamplingParams(temperature=0.9, top_k=rng.choice([0, 20]), seed=rng.randrange(99), **common)
        if kind == 2:
            return SamplingParams(temperature=0, repetition_penalty=1.6, repetition_window=rng.choice([None, 3]),
                                  frequency_penalty=rng.choice([0.0, 0.7]), **common)
        if kind == 3:
            return SamplingParams(temperature=0, min_tokens=min(3, common["max_tokens"]),
                                  stop_token_ids=[rng.randrange(3, vocab) for _ in range(20)], **common)
        if kind == 4:
            return SamplingParams(temperature=0, stop=[rng.choice(["w1", "w2", " w3"])], **common)
        if kind == 5:
            return SamplingParams(n=2, temperature=1.0, seed=rng.randrange(99), **common)
        return SamplingParams(temperature=0, stop_token_ids=[rng.randrange(3, vocab) for _ in range(30)], **common)

    requests = [(str(i), [rng.randrange(3, vocab) for _ in range(rng.randrange(1, 40))], params(),
                 rng.randrange(12)) for i in range(24)]
    aborts = {step: str(rng.randrange(24)) for step in rng.sample(range(3, 20), 4)}
    finals = {}
    for mode in (False, True):
        engine = shared.llm(max_model_len=96, num_kv_blocks=26, block_size=4, max_num_batched_tokens=24,
                            max_num_seqs=8, batch_invariant=True, async_scheduling=mode).engine
        done, step = {}, 0
        while step < 12 or engine.has_unfinished_requests():
            for request_id, prompt, sampling, arrival in requests:
                if arrival == step:
                    engine.add_request(request_id, None, sampling, prompt_token_ids=prompt)
            if step in aborts:
                engine.abort(aborts[step])
            for out in engine.step():     # each choice as it finishes (the choices of n=2 may finish apart)
                done.update({(out.request_id, c.index): c for c in out.outputs if c.finish_reason is not None})
            step += 1
        finals[mode] = {key: choice for key, choice in done.items() if key[0] not in aborts.values()}
        stats = engine.stats()
        assert_no_blocks_held(engine)
    def seen(choice):
        return (choice.token_ids, choice.text, choice.finish_reason, choice.stop_reason, choice.cumulative_logprob,
                choice.logprobs)
    assert finals[True].keys() == finals[False].keys() and len(finals[True]) >= 18
    assert {key: seen(c) for key, c in finals[True].items()} == {key: seen(c) for key, c in finals[False].items()}
    assert stats.steps_launched_ahead > 0 and stats.num_preemptions > 0, stats

