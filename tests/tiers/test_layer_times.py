"""Offloaded layers timed where the host runs the step (engine/layer_times.py), and the step cost model pricing a
demotion with those times instead of a fit the growing batch confounds."""
import random

import pytest

from gh200rt.engine.layer_times import LayerTimes
from gh200rt.engine.step_cost import StepCostModel
from gh200rt.engine.tier_controller import TierController
from gh200rt.sampling_params import SamplingParams
from gh200rt.weights.tiers import Tier
from tests.model.test_model_contract import RecordingSchedule
from tests.tiers.test_engine_placement import engine, tiny_dir  # noqa: F401 (fixture)


def test_an_offloaded_layers_excess_is_its_time_beyond_the_same_steps_resident_layers():
    times = LayerTimes(lambda layer: layer in (1, 3))
    times.record(8, [0.003, 0.005], [0.001, 0.001, 0.001, 0.001])
    times.record(8, [], [0.002])                       # nothing offloaded: no excess, but a newer resident mean
    times.record(40, [0.004], [])                      # nothing resident: the last resident mean stands in
    assert times.take() == (pytest.approx(0.006 + 0.002), ((pytest.approx(0.003), 8), (pytest.approx(0.002), 40)))
    assert times.take() == (0.0, ())


def test_an_offloaded_layer_before_any_resident_one_was_timed_is_not_priced():
    times = LayerTimes(lambda layer: True)
    times.record(8, [0.004, 0.004], [])
    assert times.take() == (0.0, ())


def test_timed_layers_call_the_hooks_they_wrap_and_file_each_layer_by_its_tier():
    times, hooks = LayerTimes(lambda layer: layer == 0), RecordingSchedule()
    timed = times.timing(hooks, 5)
    assert timed.between_layers() == hooks.between_layers() is True
    timed.begin_step(5)
    for layer in range(3):
        timed.before_layer(layer)
        timed.after_layer(layer)
    timed.finish()
    assert hooks.calls == [("begin", 5), ("before", 0), ("after", 0), ("before", 1), ("after", 1), ("before", 2),
                           ("after", 2)]
    excess, samples = times.take()
    assert len(samples) == 1 and samples[0][1] == 5 and excess == pytest.approx(samples[0][0])


def burst(costs: StepCostModel, timed: bool, steps: int = 120) -> None:
    """A burst as the controller sees it: layers demote while the batch grows, so streamed layers and rows rise
    together. A step is 10 ms + 1 ms a row; a streamed layer adds 0.8 ms + 0.05 ms a row."""
    rng = random.Random(1)
    for i in range(steps):
        streamed = min(12, i // 8)
        rows = 2 + streamed + rng.randint(0, 1)
        layer = 0.0008 + 0.00005 * rows
        seconds = 0.010 + 0.001 * rows + streamed * layer
        if timed:
            costs.observe(seconds, rows, rows, streamed, streamed * layer)
            costs.observe_layers([(layer, rows)] if streamed else [])
        else:
            costs.observe(seconds, rows, rows, streamed)


def test_timed_layers_price_a_demotion_where_the_fit_puts_their_cost_on_the_rows():
    fitted, timed = StepCostModel(0.0007), StepCostModel(0.0007)
    burst(fitted, timed=False)
    burst(timed, timed=True)
    truth = 0.010 + 0.001 * 20 + 13 * (0.0008 + 0.00005 * 20)      # 20 rows decoding, 13 layers streamed
    # the confounded fit: a layer under its cost at 20 rows (1.8 ms), a row over its own (1 ms)
    assert not fitted.timed and fitted.layer_seconds < 0.7 * 0.0018 and fitted.row_seconds > 1.3 * 0.001
    assert timed.timed and timed.layer_seconds_at(20) == pytest.approx(0.0008 + 0.00005 * 20, rel=1e-6)
    assert timed.row_seconds == pytest.approx(0.001, rel=1e-6)       # the rows' own cost, the layers' taken off
    assert timed.decode_seconds(20, 13) == pytest.approx(truth, rel=1e-6)
    # one more layer and 2 more rows from the recent steps: the new layer at their tokens, the 12 streamed ones grown
    recent, tokens = timed.recent_seconds, timed.recent_tokens
    assert timed.predict_next(2) == pytest.approx(
        recent + 0.0008 + 0.00005 * (tokens + 2) + 2 * 0.001 + 12 * 0.00005 * 2, rel=1e-6)


def test_a_dynamic_cpu_engine_hands_the_controller_its_offloaded_layers_times(tiny_dir):  # noqa: F811
    eng = engine(tiny_dir, offload="dynamic", num_kv_blocks=10)
    assert eng.runner.layer_times is not None
    seen = []
    eng.controller = TierController(eng.store, type("Record", (), {"decide": lambda self, s: seen.append(s)})())
    eng.store.set_tier(1, Tier.STREAMED)
    eng.add_request("a", None, SamplingParams(temperature=0, max_tokens=4, ignore_eos=True),
                    prompt_token_ids=list(range(3, 12)))
    for _ in range(3):
        eng.step()
    prefill, first_decode = seen[1], seen[2]           # each look describes the step before it
    assert [tokens for _, tokens in prefill.offloaded_layer_samples] == [9]
    assert [tokens for _, tokens in first_decode.offloaded_layer_samples] == [1]
    assert first_decode.offloaded_excess_seconds == pytest.approx(first_decode.offloaded_layer_samples[0][0])
    eng.close()
