"""The tier controller: the pressure policy's choices and hysteresis, and the engine under a policy that moves
layers every few steps (acceptance 1: tokens identical to all-resident; no block or slab leaks)."""
import random

import pytest

from gh200rt.config import EngineConfig
from gh200rt.engine.engine import LLMEngine
from gh200rt.engine.llm import LLM
from gh200rt.engine.step_cost import StepCostModel
from gh200rt.engine.tier_controller import Move, PressurePolicy, TierController, TierSignals, spread_pick
from gh200rt.sampling_params import SamplingParams
from gh200rt.weights.tiers import LAYER_TIERS, Tier
from tests.tiers.test_engine_placement import engine, tiny_dir  # noqa: F401 (fixture)

R, S, D = Tier.RESIDENT, Tier.STREAMED, Tier.DIRECT


def signals(step, tiers, free=50, total=100, waiting=0, waiting_blocks=0, preemptions=0, run_blocks=10,
            step_seconds=0.01, tokens=4, tpot=None):
    return TierSignals(step, total, free, total - free, waiting_blocks, waiting, preemptions, step_seconds, 0.001,
                       tokens, tokens, tpot, run_blocks, tuple(tiers))


def test_spread_pick_keeps_streamed_layers_apart():
    assert spread_pick((R, R, S, R, R, R), R, None, farthest=True) == 5
    assert spread_pick((R,) * 8, R, None, farthest=True) == 4        # nothing streams yet: the middle
    assert spread_pick((S, S, R, R, S, R), S, S, farthest=False) == 1  # the most crowded streamed layer
    assert spread_pick((R, R, R), S, S, farthest=False) is None


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_pressure_demotes_and_slack_promotes_with_hysteresis():
    clock = Clock()
    policy = PressurePolicy(min_steps_between=4, min_dwell_seconds=1.0, promote_headroom=0.25, clock=clock)
    tiers = [R] * 6
    move = policy.decide(signals(0, tiers, free=2, waiting=3, waiting_blocks=9))
    assert move == Move(3, S, move.reason) and "3 waiting need 9 blocks" in move.reason
    tiers[3] = S
    assert policy.decide(signals(0, tiers, free=2, waiting=3, waiting_blocks=9)) is None   # one move per step
    assert policy.decide(signals(1, tiers, free=2, preemptions=1)).layer == 0              # pressure: next step
    tiers[0] = S
    clock.now = 10.0
    assert policy.decide(signals(4, tiers, free=80)) is None          # quiet for too few steps since pressure
    move = policy.decide(signals(20, tiers, free=80))
    assert move.tier == R and move.layer in (0, 3) and "KV slack" in move.reason
    tiers[move.layer] = R
    assert policy.decide(signals(21, tiers, free=40)) is None         # no room for two more runs: the interval
    clock.now = 10.5
    assert policy.decide(signals(25, tiers, free=2, preemptions=1)) is None   # a reversal waits the dwell time
    clock.now = 20.0
    assert policy.decide(signals(40, tiers, free=30)) is None         # 30 - 10 < 25% of 90: stays streamed
    assert policy.decide(signals(40, tiers, free=80, waiting=1)) is None


def test_slack_promotions_follow_each_other_while_two_more_runs_stay_free():
    clock = Clock()
    policy = PressurePolicy(min_steps_between=4, min_dwell_seconds=1.0, promote_headroom=0.25, clock=clock)
    tiers = [S] * 6
    clock.now = 10.0
    first = policy.decide(signals(20, tiers, free=90))
    tiers[first.layer] = R
    second = policy.decide(signals(21, tiers, free=80))               # the next step, the dwell not yet over
    assert second.tier == R and second.layer != first.layer
    tiers[second.layer] = R
    assert policy.decide(signals(22, tiers, free=45)) is None         # 45 - 10 - 20 < 25% of 90: the interval again


def test_no_demotion_past_the_step_target_and_promotion_back_over_it():
    policy = PressurePolicy(min_steps_between=1, min_dwell_seconds=0.0, max_step_seconds=0.1, clock=Clock(),
                            costs=StepCostModel(0.01))
    tiers = [R] * 6
    # a 95 ms step plus a 10 ms layer would pass the 100 ms target: no demotion
    assert policy.decide(signals(0, tiers, free=2, waiting=3, waiting_blocks=9, step_seconds=0.095)) is None
    policy = PressurePolicy(min_steps_between=1, min_dwell_seconds=0.0, max_step_seconds=0.1, clock=Clock(),
                            costs=StepCostModel(0.01))
    # the running requests' TPOT so far (preemptions, prefill chunks) counts where it is the longer
    assert policy.decide(signals(0, tiers, free=2, waiting=3, waiting_blocks=9, step_seconds=0.05, tpot=0.095)) is None
    move = policy.decide(signals(1, tiers, free=2, waiting=3, waiting_blocks=9, step_seconds=0.05, tpot=0.06))
    assert move.tier == S and "predicted with one more streamed layer" in move.reason
    tiers[move.layer] = S
    # steps over the target with a free run: promote back even while requests wait
    back = policy.decide(signals(3, tiers, free=12, waiting=3, waiting_blocks=30, step_seconds=0.5))
    assert back == Move(move.layer, R, back.reason) and "over the target" in back.reason
    tiers[move.layer] = R
    assert policy.decide(signals(5, tiers, free=2, waiting=3, waiting_blocks=30, step_seconds=0.5)) is None


def test_step_cost_model_learns_the_streamed_layer_cost_from_mixed_steps():
    rng = random.Random(0)
    model = StepCostModel(prior_layer_seconds=0.0005)
    assert model.layer_seconds == 0.0005 and model.predict_next() is None
    for _ in range(40):                      # one split only: the prior holds
        tokens = rng.randrange(1, 400)
        model.observe(0.02 + 1e-4 * tokens + 0.003 * 10, tokens, 8, 10)
    assert model.layer_seconds == pytest.approx(0.0005, rel=0.05)
    for _ in range(200):                     # mixed steps at many splits: 3 ms per streamed layer
        tokens, rows, streamed = rng.randrange(1, 400), rng.randrange(1, 16), rng.randrange(0, 30)
        noise = rng.gauss(0, 0.001)
        model.observe(0.02 + 1e-4 * tokens + 5e-4 * rows + 0.003 * streamed + noise, tokens, rows, streamed)
    assert model.layer_seconds == pytest.approx(0.003, rel=0.1)
    assert model.predict_next() == pytest.approx(model.recent_seconds + model.layer_seconds)
    model.observe(1.0, 0, 0, 0)              # an empty step teaches nothing
    assert model.recent_seconds < 1.0


class FlipPolicy:
    """Moves a random layer to a random tier every ``every`` steps (tests: tiers change under load)."""

    def __init__(self, every: int, seed: int):
        self.every, self.rng = every, random.Random(seed)

    def decide(self, s: TierSignals):
        if s.step % self.every:
            return None
        return Move(self.rng.randrange(len(s.tiers)), self.rng.choice(list(LAYER_TIERS)), "test flip")


def run_all(eng, prompts, params, abort=None):
    for i, prompt in enumerate(prompts):
        eng.add_request(str(i), None, params, prompt_token_ids=prompt)
    done, step = {}, 0
    while eng.has_unfinished_requests():
        if abort is not None:
            for request_id in abort(step):
                eng.abort(request_id)
        for out in eng.step():
            if out.finished:
                done[out.request_id] = out.outputs[0].token_ids
        step += 1
    return done


@pytest.mark.parametrize("ahead", [False, True], ids=["sync", "async-scheduling"])
def test_moves_every_few_steps_give_all_resident_tokens_and_leak_nothing(tiny_dir, ahead):  # noqa: F811
    """With --async-scheduling a move waits for the step launched ahead to run (a no-op on the CPU, where it has)."""
    shared = list(range(10, 42))                       # two full blocks every request shares
    prompts = [shared + [50 + i, 60 + i % 3] for i in range(32)]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    reference = run_all(engine(tiny_dir, offload="none", num_kv_blocks=10), prompts, params)
    eng = engine(tiny_dir, offload="dynamic", num_kv_blocks=10, max_num_seqs=16, async_scheduling=ahead)
    assert eng.plan.dynamic and len(eng.store.slabs) == 6 and eng.store.backend is not None
    eng.controller = TierController(eng.store, FlipPolicy(every=3, seed=1))
    got = run_all(eng, prompts, params)
    stats = eng.stats()
    assert got == reference
    assert stats.num_preemptions > 0 and stats.prefix_cache_hits > 0
    assert sum(eng.controller.counts.values()) >= 5
    assert (eng.stats().steps_launched_ahead > 0) == ahead
    # 200 more requests with random aborts: every block and slab accounted for afterwards
    rng = random.Random(7)
    many = [[rng.randrange(3, 90) for _ in range(rng.randrange(3, 40))] for _ in range(200)]
    run_all(eng, many, SamplingParams(temperature=0, max_tokens=6, ignore_eos=True),
            abort=lambda step: [str(rng.randrange(200)) for _ in range(rng.random() < 0.3)])
    pool = eng.kv.pool
    assert pool.num_free == pool.num_blocks - pool.num_run_blocks
    assert all(b.ref_count == 0 for b in pool.blocks)
    assert sorted(eng.store._runs.values()) == sorted(pool.runs)
    assert len(eng.store._runs) == eng.store.tiers.count(Tier.RESIDENT)
    assert len(eng.store.slabs) == 6
    eng.close()


@pytest.mark.parametrize("budget_layers", [3])
def test_llm_offload_dynamic_on_the_cpu_platform(tiny_dir, budget_layers):  # noqa: F811
    """``LLM(..., offload="dynamic")`` with a budget below all-resident: starts with streamed layers, and a
    burst that needs more KV than it has makes the controller demote (its moves show in the stats)."""
    probe = engine(tiny_dir, offload="none")
    need = probe.ledger.used - probe.ledger.by_kind["kv_pool"] - probe.ledger.by_kind["arena_weights"]
    layer = probe.plan.sizes.layer_bytes
    block = probe.plan.sizes.kv_bytes_per_token * 16
    probe.close()
    budget = need + 6 * layer + 2 * layer + 12 * block      # all layers, the ring and 12 KV blocks
    config = EngineConfig.from_kwargs(model=tiny_dir, dtype="float32", max_model_len=128, offload="dynamic",
                                      device_memory_budget=str(budget), retier_interval_steps=2,
                                      retier_min_dwell_seconds=0.0)
    eng = LLMEngine.from_config(config, poison=True)
    assert eng.plan.dynamic and "tiers follow KV demand" in eng.plan.explain()
    outs = LLM.from_engine(eng).generate([[5 + i] * 60 for i in range(8)],
                                         SamplingParams(temperature=0, max_tokens=16, ignore_eos=True))
    assert all(len(o.outputs[0].token_ids) == 16 for o in outs)
    stats = eng.stats()
    assert stats.retier_counts["demote"] >= 1
    assert stats.arena_weight_blocks + stats.kv_blocks_total == eng.store.arena.num_blocks
    eng.close()


def test_the_engine_reports_step_time_tokens_and_the_running_requests_tpot(tiny_dir):  # noqa: F811
    eng = engine(tiny_dir, offload="dynamic", num_kv_blocks=10)
    seen = []
    eng.controller = TierController(eng.store, type("Record", (), {"decide": lambda self, s: seen.append(s)})())
    eng.add_request("a", None, SamplingParams(temperature=0, max_tokens=6, ignore_eos=True),
                    prompt_token_ids=list(range(3, 12)))
    for _ in range(4):
        eng.step()
    prefill, first_decode = seen[1], seen[2]           # each look describes the step before it
    assert (prefill.step_tokens, prefill.step_rows) == (9, 1) and prefill.step_seconds > 0
    assert prefill.tpot_seconds is None               # one output token: no TPOT yet
    assert (first_decode.step_tokens, first_decode.step_rows) == (1, 1)
    seq = next(iter(eng.scheduler.running))
    assert len(seq.output_token_ids) == 4              # the first decode look saw two of them
    assert 0 < first_decode.tpot_seconds < seq.last_token_time - seq.first_token_time
    eng.close()


def test_waiting_demand_leaves_out_prefix_blocks_running_requests_hold(tiny_dir):  # noqa: F811
    eng = engine(tiny_dir, offload="dynamic", num_kv_blocks=10, max_num_seqs=2)
    shared = list(range(10, 42))                       # two full blocks
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    eng.add_request("a", None, params, prompt_token_ids=shared + [50])
    eng.step()
    eng.add_request("b", None, params, prompt_token_ids=[80] * 20)
    eng.step()                                         # a and b run: the next requests wait for a seat
    eng.add_request("c", None, params, prompt_token_ids=shared + [60] * 20)   # 52 tokens: 4 blocks, 2 held by a
    assert eng.tier_signals().waiting_blocks == 4 - 2
    eng.add_request("d", None, params, prompt_token_ids=[70] * 40)            # shares nothing: 3 blocks
    assert eng.tier_signals().waiting_blocks == 2 + 3
    while eng.has_unfinished_requests():
        eng.step()
    eng.close()


class FixedCosts:
    """A step cost model that says: 40 ms steps, 8 ms a streamed layer, nothing a row, 0.2 ms a prompt token."""
    recent_seconds, layer_seconds, row_seconds, token_seconds = 0.04, 0.008, 0.0, 0.0002

    def observe(self, *step):
        pass

    def observe_layers(self, samples):
        pass

    def predict_next(self, extra_rows=0.0, now=None):
        return (now or self.recent_seconds) + self.layer_seconds + extra_rows * self.row_seconds

    def decode_seconds(self, rows, streamed):
        return self.recent_seconds + streamed * self.layer_seconds + rows * self.row_seconds


@pytest.mark.parametrize("kept, load, demotes", [(0, None, True), (384, 1e-5, False), (384, 2e-4, True)],
                         ids=["recomputed", "loaded-from-host", "host-loads-as-dear-as-recompute"])
def test_preemptions_are_priced_by_what_they_redo(kept, load, demotes):
    """KV pressure's three answers priced alike: a demotion that admits 1 of 3 waiting requests beside 8 running
    (9 / 48 ms < 8 / 40 ms) is declined on step time alone; preemptions since the last look that lost 400 computed
    tokens over 10 steps make each step redo 8 ms of recompute (8 / 48 ms: the demotion pays); where the host KV tier
    keeps 384 of them and a load costs a twentieth of a recompute, they redo 0.7 ms a step and the layer stays."""
    from dataclasses import replace
    policy = PressurePolicy(min_steps_between=1, min_dwell_seconds=0.0, clock=Clock(), costs=FixedCosts())
    look = replace(signals(10, [R] * 6, free=2, waiting=3, waiting_blocks=30, preemptions=1, step_seconds=0.04,
                           tokens=8), num_running=8, preempted_tokens=400, preempted_kept_tokens=kept,
                   load_seconds_per_token=load)
    redo = (400 - kept) * 0.0002 + kept * (load or 0.0)
    assert policy.preemption_seconds(look) == pytest.approx(redo)
    move = policy.decide(look)
    if demotes:
        assert move.tier == S and f"{400 - kept} tokens to recompute, {kept} to load" in move.reason
    else:
        assert move is None and policy.declined == 1
    no_preemption = replace(look, step=20, preemptions=0, preempted_tokens=0, preempted_kept_tokens=0)
    assert PressurePolicy(min_steps_between=1, min_dwell_seconds=0.0, clock=Clock(),
                          costs=FixedCosts()).decide(no_preemption) is None, "waiting alone: declined as before"


def test_a_prompt_tokens_cost_is_fitted_once_steps_compute_prompts():
    costs = StepCostModel(0.008)
    for i in range(12):
        costs.observe(0.01 + 0.001 * 8, 8, 8, 0)            # decodes only: a token and a row are one
    assert costs.token_seconds is None
    for tokens in (40, 90, 140, 200):
        costs.observe(0.01 + 0.0002 * tokens + 0.001 * 9, tokens, 9, 0)
    assert costs.token_seconds == pytest.approx(0.0002, rel=1e-6)


def test_a_demotion_that_lowers_the_batchs_tokens_per_second_is_declined():
    """Priced: the running requests and those a layer's run admits, at the predicted step, against the running ones
    now (a layer costing 8 ms on a 40 ms step pays for 3 more requests beside 8, not for 1)."""
    from dataclasses import replace
    policy = PressurePolicy(min_steps_between=1, min_dwell_seconds=0.0, clock=Clock(), costs=StepCostModel(0.008))
    tiers = [R] * 6
    # one run of 10 blocks admits 1 of 3 requests waiting for 30: 9 / 48 ms < 8 / 40 ms
    one = replace(signals(1, tiers, free=2, waiting=3, waiting_blocks=30, step_seconds=0.04, tokens=8), num_running=8)
    assert policy.decide(one) is None and policy.declined == 1
    # without the running count nothing is priced (the demotion is made)
    assert policy.decide(replace(one, step=2, num_running=None)).tier == S
    # the same run admits all 3 requests waiting for 9 blocks: 11 / 48 ms > 8 / 40 ms
    three = replace(signals(3, tiers, free=2, waiting=3, waiting_blocks=9, step_seconds=0.04, tokens=8), num_running=8)
    move = policy.decide(three)
    assert move.tier == S and policy.declined == 1
    # nothing running yet: any admission pays
    assert policy.decide(replace(one, step=4, num_running=0)).tier == S


def test_a_decode_steps_cost_is_fitted_beside_prompt_chunks():
    """The fit's decode-only step (a + (b + c) rows + d streamed) out of steps that mix prompt chunks in."""
    costs = StepCostModel(0.008)
    assert costs.decode_seconds(8, 0) is None
    rng = random.Random(3)
    for _ in range(40):
        rows, tokens, streamed = rng.randint(4, 20), rng.choice([0, 0, 128, 320]), rng.randint(0, 3)
        costs.observe(0.011 + 0.00003 * (tokens + rows) + 0.0001 * rows + 0.008 * streamed, tokens + rows, rows,
                      streamed)
    assert costs.decode_seconds(18, 0) == pytest.approx(0.011 + 18 * 0.00013, rel=1e-6)
    assert costs.decode_seconds(29, 1) == pytest.approx(0.011 + 29 * 0.00013 + 0.008, rel=1e-6)


def h200_burst_costs() -> StepCostModel:
    """The first H200's 8B shape, warm, all resident (docs/gpu-runs/h200-2026-11-30): an 11 ms decode step for 18
    sequences, 0.03 ms a prompt token, a streamed layer's copy 7.9 ms at 55 GB/s (the prior); a burst's steps carry
    320-token prompt chunks."""
    costs = StepCostModel(0.0079)
    for i in range(32):
        rows = 14 + i % 9
        tokens = rows + (320 if i % 2 else 0)
        costs.observe(0.0087 + 0.00003 * tokens + 0.0001 * rows, tokens, rows, 0)
    return costs


def test_a_demotion_is_priced_on_decode_steps_not_on_steps_swollen_by_prompt_chunks():
    """18 running at an 11 ms decode step, 30 waiting for 600 blocks, a layer's run of 218 blocks admitting 11 of
    them at 7.9 ms more a step: 29 / 20.4 ms < 18 / 11 ms, declined. Against the recent steps' mean (15.8 ms, half of
    them carrying a 320-token chunk the waiting requests' prompts pay either way) it paid (29 / 25.1 > 18 / 15.8), and
    the H200 ran six layers streamed at 0.6x all-resident's goodput."""
    from dataclasses import replace
    costs = h200_burst_costs()
    assert costs.recent_seconds == pytest.approx(0.0158, abs=1e-4)
    assert costs.decode_seconds(18, 0) == pytest.approx(0.01104, abs=1e-5)
    policy = PressurePolicy(min_steps_between=1, min_dwell_seconds=0.0, clock=Clock(), costs=costs)
    look = replace(signals(400, [R] * 32, free=8, total=440, waiting=30, waiting_blocks=600, run_blocks=218,
                           step_seconds=0.011, tokens=18), num_running=18)
    assert policy.decide(look) is None and policy.declined == 1


@pytest.mark.parametrize("every, demotes", [(None, False), (2, True)], ids=["one preemption", "a preemption a step"])
def test_preemptions_are_priced_as_a_rate_over_recent_steps(every, demotes):
    """One preemption that lost 340 computed tokens (10 ms of recompute at 0.03 ms a token) is 0.3 ms a step over the
    last 32 steps: all-resident keeps its 11 ms step and recomputes (before, the 10 ms landed on the one step since
    the last look and bought a layer's copy on every later step). Preemptions one every two steps reach 5 ms a step:
    29 / 20.4 ms > 18 / 16 ms, the layer pays."""
    from dataclasses import replace
    policy = PressurePolicy(min_steps_between=1, min_dwell_seconds=0.0, clock=Clock(), costs=h200_burst_costs())
    move = None
    for step in range(400, 432):
        preempted = step == 400 or (every is not None and step % every == 0)
        look = replace(signals(step, [R] * 32, free=8, total=440, waiting=30, waiting_blocks=600, run_blocks=218,
                               preemptions=int(preempted), step_seconds=0.011, tokens=18), num_running=18,
                       preempted_tokens=340 if preempted else 0)
        move = policy.decide(look) or move
    assert (move is not None and move.tier == S) == demotes, move
