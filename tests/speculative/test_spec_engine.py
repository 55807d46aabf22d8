"""Speculative decoding in the engine, with what else a request asks for: every case generates the same tokens with
and without n-gram drafts (``--batch-invariant``: a verified position's bits are a decoded one's), drafts were
verified and kept in each, and what the engine keeps (KV progress, prefix-cache blocks, grammar state) follows the
accepted tokens only."""
from __future__ import annotations

import random

import pytest

from gh200rt.lora.request import LoRARequest
from gh200rt.sampling_params import SamplingParams
from gh200rt.structured import Constraint
from tests.engine.real_models import SharedModel, save_tiny_llama
from tests.lora.peft_files import write_peft_adapter
from tests.model.tiny_checkpoints import save_tiny
from tests.server.byte_llama import save_byte_llama

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 3}


def looping_prompts(count: int, seed: int = 0, vocab: int = 256) -> list[list[int]]:
    """Prompts that repeat a short phrase: the tiny random model goes on repeating, so lookups find drafts."""
    rng = random.Random(seed)
    prompts = []
    for _ in range(count):
        phrase = [rng.randrange(3, vocab) for _ in range(rng.randrange(3, 6))]
        prompts.append([rng.randrange(3, vocab) for _ in range(rng.randrange(2, 9))] + phrase * 4)
    return prompts


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    return save_tiny_llama(str(tmp_path_factory.mktemp("tiny-spec")))


@pytest.fixture(scope="module")
def tiny(tiny_path):
    return SharedModel(tiny_path)


def run_both(model: SharedModel, prompts, params, **options):
    """(outputs without speculation, outputs with it, the speculator's stats)."""
    options = {"batch_invariant": True, "max_model_len": 128, "num_kv_blocks": 64, **options}
    want = model.llm(**options).generate(prompts, params)
    llm = model.llm(speculative_config=NGRAM, **options)
    got = llm.generate(prompts, params)
    return want, got, llm


def same(want, got) -> None:
    for w, g in zip(want, got):
        assert len(w.outputs) == len(g.outputs)
        for a, b in zip(w.outputs, g.outputs):
            assert (b.token_ids, b.finish_reason, b.stop_reason, b.text) == \
                (a.token_ids, a.finish_reason, a.stop_reason, a.text)
            assert b.logprobs == a.logprobs and b.cumulative_logprob == a.cumulative_logprob


def kept_drafts(llm, at_least: int = 4) -> None:
    stats = llm.engine.speculator.stats
    assert stats.num_accepted_tokens >= at_least and stats.num_draft_tokens > stats.num_accepted_tokens, stats


def test_plain_greedy_with_logprobs(tiny):
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, logprobs=3, prompt_logprobs=1)
    want, got, llm = run_both(tiny, looping_prompts(6), params)
    same(want, got)
    kept_drafts(llm, 20)
    assert [w.prompt_logprobs for w in want] == [g.prompt_logprobs for g in got]
    s = llm.engine.speculator.stats
    assert s.accepted_per_pos[0] >= s.accepted_per_pos[-1] and sum(s.accepted_per_pos) == s.num_accepted_tokens


def test_penalties_count_the_drafts_before_each_position(tiny):
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, repetition_penalty=1.05,
                            frequency_penalty=0.05, presence_penalty=0.05)
    want, got, llm = run_both(tiny, looping_prompts(4, seed=1), params)
    same(want, got)
    kept_drafts(llm, 1)


def test_stops_min_tokens_bad_words_and_logit_bias(tiny):
    prompts = looping_prompts(4, seed=2)
    plain = tiny.llm(batch_invariant=True, max_model_len=128).generate(
        prompts, SamplingParams(temperature=0, max_tokens=20, ignore_eos=True))
    looped = [o.outputs[0].token_ids for o in plain]
    cases = [
        SamplingParams(temperature=0, max_tokens=20, stop_token_ids=[looped[0][5]]),
        SamplingParams(temperature=0, max_tokens=20, ignore_eos=True, stop=[plain[1].outputs[0].text[4:9]]),
        SamplingParams(temperature=0, max_tokens=20, min_tokens=12, stop_token_ids=[looped[2][3]]),
        SamplingParams(temperature=0, max_tokens=20, ignore_eos=True, bad_words=[plain[3].outputs[0].text[:3]],
                       logit_bias={looped[3][1]: -3.0}),
    ]
    for params in cases:
        want, got, llm = run_both(tiny, prompts, params)
        same(want, got)
        kept_drafts(llm, 1)


def test_drafts_never_run_past_max_tokens_or_the_context(tiny):
    prompts = looping_prompts(3, seed=3)
    for max_tokens in (1, 2, 3):
        want, got, _ = run_both(tiny, prompts, SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True))
        same(want, got)
        assert all(len(o.outputs[0].token_ids) == max_tokens for o in got)
    longest = max(len(p) for p in prompts)
    want, got, _ = run_both(tiny, prompts, SamplingParams(temperature=0, max_tokens=None, ignore_eos=True),
                            max_model_len=longest + 6)
    same(want, got)
    assert all(len(p) + len(o.outputs[0].token_ids) == longest + 6 for p, o in zip(prompts, got))


def test_chunked_prefill_and_preemption(tiny):
    """(With async scheduling too: test_spec_async.py.)"""
    prompts = looping_prompts(8, seed=4)
    params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    for options in ({"max_num_batched_tokens": 8}, {"num_kv_blocks": 10, "block_size": 8, "max_model_len": 64}):
        want, got, llm = run_both(tiny, prompts, params, **options)
        same(want, got)
        kept_drafts(llm)
        if "num_kv_blocks" in options:
            assert llm.engine.stats().num_preemptions > 0


def test_verification_steps_replay_the_bucketed_graph_path(tiny):
    """With decode graphs on (the CPU's bucketed, padded path), a step that verifies drafts replays the graph of its
    rows' bucket (a row per position): the tokens are those of speculation run eagerly and of plain graph decoding,
    the logprobs those of the eager path to float32 rounding (the bucket's padded row count picks other GEMM
    kernels, as for any bucketed step)."""
    prompts = looping_prompts(3, seed=12)
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True, logprobs=2)
    options = {"max_model_len": 128, "num_kv_blocks": 64, "max_num_seqs": 8}
    plain = tiny.llm(enforce_eager=False, **options).generate(prompts, params)
    eager = tiny.llm(speculative_config=NGRAM, **options).generate(prompts, params)
    llm = tiny.llm(enforce_eager=False, speculative_config=NGRAM, **options)
    graphed = llm.generate(prompts, params)
    kept_drafts(llm)
    assert max(llm.engine.graphs.graphs) > len(prompts), sorted(llm.engine.graphs.graphs)   # verifying rows' buckets
    assert llm.engine.config.max_graph_batch == 8 * (1 + 4)       # max_num_seqs rows of 1 + k positions
    for want, other, got in zip(eager, plain, graphed):
        assert got.outputs[0].token_ids == want.outputs[0].token_ids == other.outputs[0].token_ids
        for a, b in zip(want.outputs[0].logprobs, got.outputs[0].logprobs):
            assert a.keys() == b.keys() and max(abs(a[t].logprob - b[t].logprob) for t in a) < 1e-4


def test_only_accepted_tokens_reach_the_prefix_cache(tiny):
    """Batch-invariant engines publish decoded blocks: a second request over the first's prompt and output reuses
    them, and its tokens equal a fresh engine's, so no block held a rejected draft's KV."""
    first = looping_prompts(1, seed=5)[0]
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    llm = tiny.llm(batch_invariant=True, max_model_len=128, num_kv_blocks=64, block_size=4,
                   speculative_config=NGRAM)
    answer = llm.generate([first], params)[0].outputs[0].token_ids
    kept_drafts(llm)
    second = first + list(answer) + [7, 8, 9]
    got = llm.generate([second], params)[0]
    assert got.num_cached_tokens >= len(first) + 32
    fresh = tiny.llm(batch_invariant=True, max_model_len=128, enable_prefix_caching=False).generate([second], params)
    assert got.outputs[0].token_ids == fresh[0].outputs[0].token_ids


def test_several_choices_and_seeds_sample_from_the_target(tiny):
    prompts = looping_prompts(2, seed=6)
    params = SamplingParams(temperature=0.5, top_k=3, max_tokens=16, ignore_eos=True, n=3, seed=11)
    llm = tiny.llm(max_model_len=128, speculative_config=NGRAM)
    first = llm.generate(prompts, params)
    again = llm.generate(prompts, params)
    assert all(len(o.outputs) == 3 and all(len(c.token_ids) == 16 for c in o.outputs) for o in first)
    assert [[c.token_ids for c in o.outputs] for o in first] == [[c.token_ids for c in o.outputs] for o in again]
    kept_drafts(llm, 1)


def test_moe_model(tmp_path):
    path = str(tmp_path / "moe")
    save_tiny("qwen3-moe-norm", path)
    from tests.model.tiny_checkpoints import VOCAB
    want, got, llm = run_both(SharedModel(path), looping_prompts(4, seed=7, vocab=VOCAB),
                              SamplingParams(temperature=0, max_tokens=24, ignore_eos=True))
    same(want, got)
    kept_drafts(llm)


def test_lora_adapters(tmp_path):
    hf = save_tiny("llama3-gqa-untied", str(tmp_path / "model"))
    adapter = write_peft_adapter(str(tmp_path / "a"), hf, r=4, alpha=8, seed=1)
    model = SharedModel(str(tmp_path / "model"))
    options = dict(enable_lora=True, lora_modules=(f"a={adapter}",), max_lora_rank=8)
    prompts = looping_prompts(3, seed=8, vocab=200)
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    lora = LoRARequest("a", 1, adapter)
    want = model.llm(batch_invariant=True, **options).generate(prompts, params, lora_request=lora)
    llm = model.llm(batch_invariant=True, speculative_config=NGRAM, **options)
    got = llm.generate(prompts, params, lora_request=lora)
    same(want, got)
    kept_drafts(llm, 1)


def test_a_grammar_masks_every_verified_position(tmp_path):
    model = SharedModel(save_byte_llama(str(tmp_path)))
    schema = {"type": "object", "required": ["k"], "properties": {"k": {"enum": ["abcabcabc", "abd"]}}}
    prompts = ["abcabcabc abcabcabc {\"k\": \"abcabcabc\"} {\"k\": \"abc", "xyz xyz xyz {"]
    params = SamplingParams(temperature=0, max_tokens=40, structured_output=Constraint.json_schema(schema))
    want, got, llm = run_both(model, prompts, params)
    same(want, got)
    kept_drafts(llm, 1)


# ---- draft_model ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def drafts(tmp_path_factory):
    """Paths of drafts for the tiny target: a one-layer model of its family, and one with another vocabulary."""
    root = tmp_path_factory.mktemp("drafts")
    return {"small": save_tiny_llama(str(root / "small"), num_layers=1),
            "other_vocab": save_tiny_llama(str(root / "other"), vocab_size=320, num_layers=1)}


def draft_config(path: str, k: int = 3) -> dict:
    return {"method": "draft_model", "model": path, "num_speculative_tokens": k}


def test_a_draft_model_keeps_greedy_output_and_is_booked(tiny, drafts, tiny_path):
    prompts = looping_prompts(5, seed=9)
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True, logprobs=2)
    want = tiny.llm(batch_invariant=True, max_model_len=128).generate(prompts, params)
    for draft in (drafts["small"], tiny_path):           # a weaker draft, and the target itself
        llm = tiny.llm(batch_invariant=True, max_model_len=128, speculative_config=draft_config(draft))
        same(want, llm.generate(prompts, params))
        stats = llm.engine.speculator.stats
        assert stats.num_draft_tokens > 20, stats
        if draft == tiny_path:                           # drafting with the target itself: (nearly) all kept
            assert stats.acceptance_rate > 0.9, stats
    ledger = llm.engine.ledger.by_kind
    assert ledger["draft_weights"] > 0 and ledger["draft_kv"] == llm.engine.speculator.draft.kv_bytes > 0


def test_a_placed_engine_books_the_draft_before_its_kv_pool(tiny_path, drafts):
    """Through ``load_and_place``: the draft's weights and KV are booked before the pool takes what is left, and
    its KV cache has the pool's blocks."""
    from gh200rt.engine.llm import LLM
    llm = LLM(tiny_path, dtype="float32", max_model_len=128, speculative_config=draft_config(drafts["small"]))
    try:
        engine = llm.engine
        out = llm.generate(looping_prompts(2, seed=11), SamplingParams(temperature=0, max_tokens=8))
        assert all(len(o.outputs[0].token_ids) == 8 for o in out)
        ledger = engine.ledger
        assert ledger.by_kind["draft_weights"] > 0
        assert ledger.by_kind["draft_kv"] == engine.speculator.draft.kv_bytes
        assert engine.speculator.draft.kv_caches[0].shape[1] == engine.plan.num_kv_blocks
        assert ledger.used <= ledger.capacity
    finally:
        llm.engine.close()


def through_preemption_chunks_and_sampling(model: SharedModel, speculative_config: dict) -> list:
    """What every drafter that keeps its own KV must hold: greedy output equal to plain decoding (batch-invariant)
    with a pool small enough to preempt and with prompts in chunks of 8 tokens, and seeded sampled choices that repeat.
    Returns the two greedy runs' LLMs, for the drafter's own checks."""
    prompts = looping_prompts(6, seed=10)
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    greedy = []
    for options in ({"num_kv_blocks": 12, "block_size": 8, "max_model_len": 64}, {"max_num_batched_tokens": 8}):
        want = model.llm(batch_invariant=True, **options).generate(prompts, params)
        llm = model.llm(batch_invariant=True, speculative_config=speculative_config, **options)
        same(want, llm.generate(prompts, params))
        if "num_kv_blocks" in options:
            assert llm.engine.stats().num_preemptions > 0
        greedy.append(llm)
    sampled = SamplingParams(temperature=0.8, max_tokens=12, ignore_eos=True, n=2, seed=3)
    llm = model.llm(max_model_len=128, speculative_config=speculative_config)
    first, again = llm.generate(prompts[:2], sampled), llm.generate(prompts[:2], sampled)
    assert [[c.token_ids for c in o.outputs] for o in first] == [[c.token_ids for c in o.outputs] for o in again]
    assert llm.engine.speculator.stats.num_draft_tokens > 0
    return greedy


def test_a_draft_model_through_preemption_chunks_and_sampling(tiny, drafts):
    through_preemption_chunks_and_sampling(tiny, draft_config(drafts["small"], 4))


def test_a_preempted_sequence_catches_its_draft_up_again(tiny, tiny_path):
    """The target drafting for itself accepts (nearly) every draft; a sequence preempted and recomputed gets new
    blocks, whose draft KV its draft must compute again (it did not: every draft after the preemption was made
    over stale KV and rejected)."""
    prompts = looping_prompts(6, seed=10)
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    llm = tiny.llm(batch_invariant=True, num_kv_blocks=12, block_size=8, max_model_len=64,
                   speculative_config=draft_config(tiny_path, 3))
    llm.generate(prompts, params)
    stats = llm.engine.speculator.stats
    assert llm.engine.stats().num_preemptions > 0
    assert stats.num_accepted_tokens >= 0.9 * stats.num_draft_tokens, stats      # 64 of 102 before the fix


def test_a_draft_model_beside_the_host_kv_tier(tiny, tiny_path):
    """Blocks a small pool evicted come back from the host tier with the target's KV only: the draft catches up on
    every prompt it has not seen from position 0, so its KV over loaded blocks is computed, not stale (the target
    drafting for itself keeps nearly every draft), and the output is plain decoding's."""
    from tests.engine.test_host_kv_tier import conversations, synchronous_stores, talk
    firsts = conversations(256, count=3, system=0)
    options = dict(batch_invariant=True, max_model_len=128, num_kv_blocks=8)
    want = talk(tiny.llm(**options), firsts, turns=2, max_tokens=12)
    llm = tiny.llm(kv_offloading_size="16MiB", speculative_config=draft_config(tiny_path, 3), **options)
    synchronous_stores(llm)
    assert talk(llm, firsts, turns=2, max_tokens=12) == want
    host, stats = llm.engine.stats().kv_host, llm.engine.speculator.stats
    assert host.hit_tokens >= 2 * 48 and host.loaded_blocks >= 6, host
    assert stats.num_draft_tokens > 20 and stats.num_accepted_tokens >= 0.9 * stats.num_draft_tokens, stats
    with pytest.raises(ValueError, match="in_place with the draft_model method is not supported yet"):
        tiny.llm(kv_offloading_size="16MiB", kv_offloading_reads="in_place",
                 speculative_config=draft_config(tiny_path, 3), **options)


def test_a_draft_that_cannot_serve_is_refused_with_what_to_do(tiny, drafts, tmp_path):
    with pytest.raises(ValueError, match="vocabulary of 320 tokens, the target 256"):
        tiny.llm(speculative_config=draft_config(drafts["other_vocab"]))
    with pytest.raises(ValueError, match="draft model '.*nowhere' not found"):
        tiny.llm(speculative_config=draft_config(str(tmp_path / "nowhere")))
