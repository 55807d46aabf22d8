"""Acceptance 2: greedy outputs do not depend on batching, preemption, prefix caching or chunking.

32 prompts of varied lengths (some sharing long prefixes) on SmolLM2 and on a tiny random Llama.
Where a token differs from one-at-a-time generation, the test proves it was a near tie.
"""
import random

import pytest
import torch

from gh200rt.sampling_params import SamplingParams
from tests.engine.real_models import BACKENDS, SharedModel, assert_same_or_near_tie, save_tiny_llama
from tests.engine.route_engines import describe_difference, first_step_logits, route_llm, sampled_logits


def make_prompts(vocab: int, count: int = 32, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    shared = [[rng.randrange(3, vocab) for _ in range(n)] for n in (40, 33)]
    prompts = []
    for i in range(count):
        head = shared[i % 2] if i % 4 < 2 else []
        prompts.append(head + [rng.randrange(3, vocab) for _ in range(rng.randrange(1, 30))])
    return prompts


def check_invariance(shared: SharedModel, vocab: int, max_tokens: int, small_pool: int, count: int = 32,
                     only: tuple[str, ...] | None = None, **cache):
    """``count`` prompts (half of them behind one of two shared heads); ``only``: the runs to make (default: all);
    ``cache``: KV cache options every engine shares (e.g. ``kv_cache_dtype="fp8"``)."""
    prompts = make_prompts(vocab, count)
    ref_params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True, logprobs=2)
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    ref_llm = shared.llm(enable_prefix_caching=False, max_model_len=128, num_kv_blocks=64, **cache)
    reference = [ref_llm.generate([p], ref_params)[0] for p in prompts]
    runs = {
        "all at once": {"num_kv_blocks": 256},
        "prefix caching off": {"enable_prefix_caching": False, "num_kv_blocks": 256},
        "tiny prefill chunks": {"max_num_batched_tokens": 7, "num_kv_blocks": 256},
        "small pool (preemption)": {"num_kv_blocks": small_pool},
    }
    if shared.backend == "gh200rt":   # decode steps bucketed and padded as CUDA graphs replay them
        runs["bucketed decode (graph path), small pool"] = {"num_kv_blocks": small_pool, "enforce_eager": False,
                                                           "max_graph_batch": 16}
    for label, options in runs.items():
        if only is not None and label not in only:
            continue
        llm = shared.llm(max_model_len=128, **options, **cache)
        assert llm.engine.runner.kv_caches[0].dtype == {"fp8": torch.float8_e4m3fn}.get(
            cache.get("kv_cache_dtype"), torch.float32)
        outs = llm.generate(prompts, params)
        assert_same_or_near_tie(reference, outs, label)
        stats = llm.engine.stats()
        if label.startswith("bucketed"):
            assert stats.graph_captures > 0, "no decode step took the bucketed path"
        if "small pool" in label:
            assert stats.num_preemptions > 0, "the small pool did not force a preemption"
        if label == "all at once":
            # Admitted together, nothing was cached yet; a second pass must reuse every shared prefix.
            assert_same_or_near_tie(reference, llm.generate(prompts, params), "all at once, warm prefix cache")
            stats = llm.engine.stats()
            assert stats.prefix_cache_hits >= count // 2 and stats.prefix_cache_hit_tokens >= count // 2 * 32
        if label == "tiny prefill chunks":
            assert stats.prefix_cache_hits > 0     # later prompts found the earlier ones' prefixes


@pytest.mark.parametrize("backend", BACKENDS)
def test_invariance_tiny_random_llama(tmp_path, backend):
    path = save_tiny_llama(str(tmp_path / "tiny-llama"))
    check_invariance(SharedModel(path, backend), vocab=256, max_tokens=16, small_pool=12)


def test_invariance_tiny_random_llama_fp8_kv(tmp_path):
    """An fp8 KV cache with fixed per-layer scales: quantizing a token's K/V depends on nothing but
    that token, so batching, chunking, prefix reuse and preemption still change nothing."""
    path = save_tiny_llama(str(tmp_path / "tiny-llama"))
    check_invariance(SharedModel(path), vocab=256, max_tokens=16, small_pool=12, kv_cache_dtype="fp8")


def test_invariance_smollm2(short_smollm2):
    # SmolLM2's first four blocks, short generations, 8 prompts and the runs that batch, preempt and bucket keep this
    # within the test budget on a 2-core machine (the tiny random models above make every run with 32 prompts each)
    check_invariance(SharedModel(short_smollm2, "gh200rt"), vocab=49152, max_tokens=12, small_pool=8, count=8,
                     only=("all at once", "small pool (preemption)", "bucketed decode (graph path), small pool"))


# --- prefix-cache invariance on every CPU route: bits, not near ties -----------------------------------------------
# (prompt length, cached blocks of 16): 65 tokens leave 49 to compute after one block and the last alone once all
# four are cached; 70 tokens leave a tail of 38 (kept to three splits: every route runs them, within CI's time)
PREFIX_SPLITS = [(65, 1), (65, 4), (70, 2)]


def random_prompt(length: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 49152) for _ in range(length)]


@pytest.mark.slow
def test_a_prefix_cached_prompt_gets_a_cold_prefills_bits(cpu_route, short_smollm2):
    """The last prompt position's logits, bit for bit, and the greedy tokens after them: a cold prefill against
    the same prompt with 1, 2 or 4 of its blocks from the prefix cache, and against a prefill in chunks of 7
    tokens (max_num_batched_tokens)."""
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    prompts = [random_prompt(length, seed=i) for i, (length, _) in enumerate(PREFIX_SPLITS)]
    first_turn = random_prompt(29, seed=50)
    with route_llm(cpu_route, short_smollm2, enable_prefix_caching=False) as cold:
        want = [first_step_logits(cold, prompt, params) for prompt in prompts]
        # a second turn repeats the first turn's answer: 29 + 4 + 13 tokens, blocks 0-1, the second with decoded tokens
        answer = list(cold.generate([first_turn], params)[0].outputs[0].token_ids)
        second_turn = first_turn + answer + prompts[0][:13]
        want_second = first_step_logits(cold, second_turn, params)
    with route_llm(cpu_route, short_smollm2) as warm:
        warm.generate([first_turn], params)
        hit_tokens = warm.engine.stats().prefix_cache_hit_tokens
        got_tokens, got = first_step_logits(warm, second_turn, params)
        # a block holding decoded tokens is not published: its K/V came from a decode step's kernels
        assert warm.engine.stats().prefix_cache_hit_tokens - hit_tokens == 16
        assert torch.equal(got, want_second[1]), f"second turn: {describe_difference(got, want_second[1])}"
        assert got_tokens == want_second[0]
        for prompt, (length, blocks), (want_tokens, want_logits) in zip(prompts, PREFIX_SPLITS, want):
            warm.generate([prompt[:16 * blocks + 1]], SamplingParams(temperature=0, max_tokens=1))  # publishes them
            hit_tokens = warm.engine.stats().prefix_cache_hit_tokens
            got_tokens, got = first_step_logits(warm, prompt, params)
            assert warm.engine.stats().prefix_cache_hit_tokens - hit_tokens == 16 * blocks
            label = f"{cpu_route.name}: {length}-token prompt, {blocks} blocks cached"
            assert torch.equal(got, want_logits), f"{label}: {describe_difference(got, want_logits)}"
            assert got_tokens == want_tokens, label
    for budget in (7,):      # one chunked engine: each engine build loads SmolLM2 for the route
        with route_llm(cpu_route, short_smollm2, enable_prefix_caching=False,
                       max_num_batched_tokens=budget) as chunked:
            for prompt, (want_tokens, want_logits) in list(zip(prompts, want))[2:]:   # 70 tokens
                got_tokens, got = first_step_logits(chunked, prompt, params)
                label = f"{cpu_route.name}: {len(prompt)}-token prompt in chunks of {budget}"
                assert torch.equal(got, want_logits), f"{label}: {describe_difference(got, want_logits)}"
                assert got_tokens == want_tokens, label


@pytest.mark.slow
def test_a_prompt_beside_other_requests_gets_its_bits_alone(cpu_route, short_smollm2):
    """A prompt prefilled in a step with three other sequences decoding, and with another prompt: the same
    first-token logits as alone (a prompt row's linears do not depend on the rows beside it)."""
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    prompt = random_prompt(37, seed=100)
    with route_llm(cpu_route, short_smollm2, enable_prefix_caching=False) as llm:
        want_tokens, want = first_step_logits(llm, prompt, params)
        engine, runner = llm.engine, llm.engine.runner
        for i, length in enumerate((12, 50, 3)):
            engine.add_request(f"other-{i}", None, SamplingParams(temperature=0, max_tokens=30, ignore_eos=True),
                               prompt_token_ids=random_prompt(length, seed=200 + i))
        engine.step()                                # the three others prefill; the next steps decode them
        engine.add_request("late", None, params, prompt_token_ids=prompt)
        engine.add_request("beside", None, params, prompt_token_ids=random_prompt(20, seed=300))
        run, seen = runner.run, []

        def recording(out):
            seen.append([item.seq.seq_id for item in out.scheduled if item.samples])   # the rows that sample
            return seen.append(run(out)) or seen[-1]
        runner.run = recording
        try:
            engine.step()
        finally:
            del runner.run
    rows, logits = seen
    assert len(rows) == 5, rows              # three decodes and two prompts in one step
    got = logits.sample_logits[rows.index("late#0")]
    assert torch.equal(got, want), f"{cpu_route.name}: {describe_difference(got, want)}"


@pytest.mark.slow
def test_batch_invariant_tokens_do_not_depend_on_the_batch(cpu_route, short_smollm2):
    """--batch-invariant: a request's logits at every step, bit for bit, alone and with five others that arrive
    before, with and after it (decode batches of 1-6, steps mixing prompts and decodes); and a prompt that repeats
    an earlier answer gets a cold prefill's bits from the answer's decoded blocks in the prefix cache."""
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    prompt = random_prompt(29, seed=400)
    others = [(f"other-{i}", random_prompt(length, seed=401 + i), params, arrival)
              for i, (length, arrival) in enumerate([(5, 0), (40, 0), (17, 1), (60, 3), (2, 6)])]
    with route_llm(cpu_route, short_smollm2, batch_invariant=True, enable_prefix_caching=False) as llm:
        want_tokens, want = sampled_logits(llm, [("me", prompt, params, 0)], "me")
        got_tokens, got = sampled_logits(llm, [*others[:2], ("me", prompt, params, 1), *others[2:]], "me")
        follow_up = prompt + want_tokens + random_prompt(5, seed=500)   # 46 tokens: blocks 0-1 hold decoded tokens
        cold_tokens, cold = first_step_logits(llm, follow_up, params)
    assert got_tokens == want_tokens, cpu_route.name
    for step, (g, w) in enumerate(zip(got, want)):
        assert torch.equal(g, w), f"{cpu_route.name}, step {step}: {describe_difference(g, w)}"
    want_tokens, want = cold_tokens, cold
    with route_llm(cpu_route, short_smollm2, batch_invariant=True) as warm:
        warm.generate([prompt], params)
        got_tokens, got = first_step_logits(warm, follow_up, params)
        assert warm.engine.stats().prefix_cache_hit_tokens == 32    # both blocks, the second decoded
    assert torch.equal(got, want), f"{cpu_route.name}: {describe_difference(got, want)}"
    assert got_tokens == want_tokens
