"""``num_speculative_tokens: "auto"``: the k a step drafts follows the measured acceptance and the measured cost of a
step over its tokens: a flat curve (a link-bound step) drafts the most, a steep one (compute-bound) the fewest, low
acceptance none; exploration keeps measuring; and in the engine greedy output is what decoding without drafts gives."""
from __future__ import annotations

import pytest

from gh200rt.sampling_params import SamplingParams
from gh200rt.speculative.auto_k import EXPLORE_EVERY, EXPLORE_MAX, AcceptanceModel, AutoK, StepCostCurve
from tests.speculative.test_spec_engine import looping_prompts, same, tiny, tiny_path  # noqa: F401


def trained(rate: float, cost, k_max: int = 8, sizes=(1, 2, 4, 8, 16, 32, 64)) -> AutoK:
    """A chooser that saw 400 verifications keeping each draft with chance ``rate`` (as fractions of a k_max-token
    draft) and steps costing ``cost(tokens)``."""
    auto = AutoK(k_max)
    for i in range(400):      # accepted counts spread so that position j is kept with chance ~rate
        accepted, x = 0, (i * 0.6180339) % 1.0
        while accepted < k_max and x < rate ** (accepted + 1):
            accepted += 1
        auto.record(k_max, accepted)
    for tokens in sizes:
        auto.observe(tokens, cost(tokens))
    return auto


def steps(auto: AutoK, batch: int, count: int, cost, proposes=lambda i: True) -> list[int]:
    """``count`` steps of ``batch`` sequences as the engine runs them: each drafts the k chosen (where ``proposes(i)``,
    else nothing: no n-gram match) and is observed at its cost; the k chosen, step by step."""
    picks = []
    for i in range(count):
        k = auto.choose(batch)
        picks.append(k)
        tokens = batch * (1 + (k if proposes(i) else 0))
        auto.observe(tokens, cost(tokens))
    return picks


def choose(auto: AutoK, batch: int) -> int:
    auto.explore_in = EXPLORE_EVERY      # not an exploring step
    return auto.choose(batch)


def test_acceptance_by_position_from_verifications():
    model = AcceptanceModel(4)
    for _ in range(300):
        model.record(4, 2)     # the first two kept, the third rejected, the fourth never reached
    assert model.rate(0) > 0.98 and model.rate(1) > 0.98 and model.rate(2) < 0.02
    assert model.rate(3) == pytest.approx(0.5)          # never reached: the prior
    assert model.expected_tokens(0) == 1 and model.expected_tokens(4) == pytest.approx(3.0, abs=0.05)


def test_the_cost_curve_interpolates_and_never_falls_beyond_its_points():
    curve = StepCostCurve()
    for tokens, seconds in ((2, 1.0), (10, 3.0), (40, 3.0)):
        curve.observe(tokens, seconds)
    assert curve.cost(1) == 1.0 and curve.cost(6) == pytest.approx(2.0) and curve.cost(100) == 3.0


def test_a_flat_step_drafts_the_most_a_steep_one_the_fewest():
    flat = trained(0.8, lambda tokens: 0.010)                     # link-bound: k tokens cost what one costs
    steep = trained(0.8, lambda tokens: 0.001 * tokens)          # compute-bound: each token costs its share
    assert choose(flat, 1) == 8 and choose(flat, 8) == 8
    assert choose(steep, 8) == 0
    knee = trained(0.8, lambda tokens: max(0.010, 0.0005 * tokens))   # flat until 20 tokens, then steep
    assert 1 <= choose(knee, 4) <= 4 and choose(knee, 1) > choose(knee, 4)


def test_low_acceptance_drafts_nothing_but_keeps_measuring():
    cost = lambda tokens: 0.010 + 0.0008 * tokens    # noqa: E731
    auto = trained(0.05, cost)
    picks = steps(auto, 4, 4 * EXPLORE_EVERY, cost)
    assert picks.count(1) == 2 and picks.count(0) == len(picks) - 2   # at step 16, then 32 steps later
    assert [i + 1 for i, k in enumerate(picks) if k] == [EXPLORE_EVERY, 3 * EXPLORE_EVERY]


def test_exploring_grows_rarer_while_the_choice_holds_and_frequent_again_once_it_moves():
    cost = lambda tokens: 0.006 + 0.004 * tokens if tokens <= 3 else 0.05 * tokens    # noqa: E731
    knee = trained(0.05, cost, sizes=(1, 2, 3, 4, 8))
    picks = steps(knee, 1, 1000, cost)
    explored = [i + 1 for i, k in enumerate(picks) if k]
    gaps = [b - a for a, b in zip(explored, explored[1:])]
    assert explored[0] == EXPLORE_EVERY and gaps == sorted(gaps) and max(gaps) == EXPLORE_MAX
    assert len(explored) == 6           # 16, 48, 112, 240, 496, 752: every 16th step would explore 62 times
    for _ in range(400):                # the drafts now keep: k = 2 pays, the choice moves
        knee.record(8, 8)
    picks = steps(knee, 1, EXPLORE_EVERY, cost)
    assert sorted(picks) == [2] * (EXPLORE_EVERY - 1) + [3]     # explored again within 16 steps of the move


def test_an_exploring_step_that_drafted_nothing_is_taken_again_the_next_step():
    cost = lambda tokens: 0.010 + 0.0008 * tokens    # noqa: E731
    auto = trained(0.05, cost)
    picks = steps(auto, 4, 3 * EXPLORE_EVERY, cost, proposes=lambda i: i not in (15, 16, 17))   # no match there
    # the 16th step explores and its drafter proposes nothing, so do the next two; the fourth drafts, and the next
    # exploring step is 32 steps after it (beyond these 48)
    assert [i for i, k in enumerate(picks) if k] == [15, 16, 17, 18]


def test_a_curve_that_jumps_then_stays_flat_is_explored_until_the_k_that_pays_is_found():
    """One row reads the GGUF blocks (17 ms), 2-8 rows take another route (38-45 ms), 9 rows a third (93 ms): a line
    through the first sizes measured puts 5 rows at 3.6x one row, and exploring one more than the best choice (k = 0)
    never tries them. The first draft is kept with chance 0.67, and then a run of 1-12 drafts (an n-gram lookup's)."""
    def true_cost(tokens: int) -> float:
        return 0.017 if tokens == 1 else 0.038 + 0.001 * (tokens - 2) if tokens <= 8 else 0.093

    def kept(k: int, i: int) -> int:         # the drafts a verification keeps, spread deterministically
        x = (i * 0.6180339) % 1.0
        return 0 if x >= 0.67 else min(k, 1 + int(x / 0.67 * 12))

    auto = AutoK(8)
    tokens = seconds = 0.0
    picks = []
    for i in range(2000):
        k = auto.choose(1)
        picks.append(k)
        auto.observe(1 + k, true_cost(1 + k))
        if k:
            auto.record(k, kept(k, i))
        tokens += 1 + (kept(k, i) if k else 0)
        seconds += true_cost(1 + k)
    late = picks[1000:]
    assert max(set(late), key=late.count) >= 3, sorted(set(late))
    assert tokens / seconds > 1.1 / true_cost(1)      # faster than not drafting at all


def test_until_two_step_sizes_are_measured_it_drafts_k_max_then_nothing():
    auto = AutoK(5)
    assert auto.choose(3) == 5
    auto.observe(4, 0.01)
    assert auto.choose(3) == 5
    always = AutoK(5)
    always.observe(18, 0.02)     # a drafter that always drafts k_max: the other end is measured next
    assert always.choose(3) == 0


def test_auto_k_in_the_engine_keeps_greedy_output_and_reports_k(tiny):  # noqa: F811
    prompts = looping_prompts(6, seed=3)
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    options = {"batch_invariant": True, "max_model_len": 128, "num_kv_blocks": 64}
    want = tiny.llm(**options).generate(prompts, params)
    llm = tiny.llm(speculative_config={"method": "ngram", "num_speculative_tokens": "auto", "prompt_lookup_min": 1,
                                       "prompt_lookup_max": 3}, **options)
    got = llm.generate(prompts, params)
    same(want, got)
    stats = llm.engine.stats().spec_decode
    assert stats.num_accepted_tokens > 0 and len(stats.accepted_per_pos) == 8
    assert stats.current_k is not None and 0 <= stats.current_k <= 8
    assert sum(llm.engine.speculator.auto.curve.seconds) > 0


def test_the_plan_prints_the_k_that_pays_on_its_cost_curve(capsys):
    from gh200rt import plan
    model = ["--model", "tests/fixtures/llama31_70b_fp8", "--platform", "h200"]
    auto = ["--speculative-config", '{"method": "ngram", "num_speculative_tokens": "auto"}']
    assert plan.main([*model, "--offload", "stream", *auto]) == 0      # link-bound: every k costs one token's step
    streamed = capsys.readouterr().out
    assert "acceptance 0.5: k = 8 pays best" in streamed and "k = 8 pays best, 6.13x" in streamed
    assert plan.main([*model, "--offload", "none", "--device-memory-budget", "200GiB", "--batch", "32", *auto]) == 0
    resident = capsys.readouterr().out      # 32 sequences on resident weights: compute bounds the step from 96 tokens
    assert "acceptance 0.5: k = 2 pays best" in resident and "acceptance 0.9: k = 3 pays best" in resident
