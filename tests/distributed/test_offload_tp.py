"""Streamed and direct layers per tensor-parallel rank on the CPU: with --offload stream / direct and --layer-tiers,
TP=2 greedy tokens equal TP=1's in float32, each rank's host slabs hold its shard (1/2 of the layers' linears) and
every rank places the same tiers. Dynamic tiers: rank 0's moves (a policy that flips a layer's tier every few steps)
are made by every rank before the same step, into the same arena blocks: TP=1's all-resident tokens, and no run or
slab lost on any rank; a GH200 profile with the default --offload auto (dynamic there) starts."""
from __future__ import annotations

import pytest

from gh200rt.distributed.launch import usable_cores
from gh200rt.distributed.placement_sync import placement
from gh200rt.engine.tier_controller import TierController
from gh200rt.sampling_params import SamplingParams
from tests.distributed.tiny_tp_models import save_tp_tiny, tp_llm
from tests.engine.real_models import assert_same_or_near_tie
from tests.tiers.test_tier_controller import FlipPolicy

pytestmark = pytest.mark.skipif(usable_cores() < 2, reason="two ranks need two CPU cores")
PROMPTS = [[5, 9, 33, 71, 100, 4], list(range(7, 40))]
GREEDY = SamplingParams(temperature=0, max_tokens=10, logprobs=2)
# hidden 64, q 64, kv 2x32, intermediate 128, float32: one layer's qkv, o, gate_up and down
LAYER_BYTES = (128 * 64 + 64 * 64 + 256 * 64 + 64 * 128) * 4


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    path = save_tp_tiny("llama-gqa", str(tmp_path_factory.mktemp("llama-gqa")))
    single = tp_llm(path, 1)
    reference = single.generate(PROMPTS, GREEDY)
    single.engine.close()
    return path, reference


@pytest.mark.parametrize("options,tiers", [
    (dict(offload="stream"), ["streamed", "streamed"]),
    (dict(offload="direct"), ["direct", "direct"]),
    (dict(layer_tiers="0:streamed,1:direct"), ["streamed", "direct"]),
])
def test_offloaded_layers_per_rank_give_tp1_tokens(llama, options, tiers):
    path, reference = llama
    llm = tp_llm(path, 2, **options)
    try:
        assert_same_or_near_tie(reference, llm.generate(PROMPTS, GREEDY), f"TP=2 {options}")
        reports = llm.engine.parallel.reports
        for rank, report in reports.items():
            assert report["layer_tiers"] == tiers, (rank, report)
            assert report["host_slab_bytes"] == 2 * LAYER_BYTES // 2, (rank, report)   # 2 layers, 1/2 each
        assert llm.engine.plan.rank_share.world_size == 2
    finally:
        llm.engine.close()


def assert_no_run_or_slab_lost(engine, layers: int) -> None:
    """Rank 0's pool and store agree, and every worker stopped with rank 0's placement, runs and slabs."""
    pool, store = engine.kv.pool, engine.store
    assert pool.num_free == pool.num_blocks - pool.num_run_blocks
    assert all(b.ref_count == 0 for b in pool.blocks)
    assert sorted([*store._runs.values(), *store._expert_runs.values()]) == sorted(pool.runs)
    sent = engine.runner.placement.sent
    runs = sorted(pool.runs.items())
    slabs, expert_slabs = sorted(store.slabs), sorted(store.expert_slabs)
    assert len(slabs) == layers
    engine.close()
    finals = engine.parallel.final_reports
    assert sorted(finals) == list(range(1, engine.parallel.world_size)), finals.keys()
    for rank, final in finals.items():
        assert final["placement"] == sorted([*unit, tier.value, start] for unit, (tier, start) in sent.items()), rank
        assert [tuple(r) for r in final["runs"]] == runs, (rank, final["runs"], runs)
        assert final["free_blocks"] == final["num_blocks"] - sum(n for _, n in runs), (rank, final)
        assert final["layer_slabs"] == slabs and final["expert_slabs"] == expert_slabs, (rank, final)


def test_dynamic_tiers_move_the_same_layer_into_the_same_blocks_on_every_rank(llama):
    path, _ = llama
    prompts = [list(range(10, 42)) + [50 + i, 60 + i % 3] for i in range(12)]
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=2)
    single = tp_llm(path, 1, num_kv_blocks=40)
    reference = single.generate(prompts, params)
    single.engine.close()
    llm = tp_llm(path, 2, offload="dynamic", num_kv_blocks=40, device_memory_budget=16 << 20)
    engine = llm.engine
    try:
        assert engine.plan.dynamic and engine.store.arena is not None
        assert engine.parallel.reports[1]["arena"] == engine.parallel.reports[0]["arena"]
        engine.controller = TierController(engine.store, FlipPolicy(every=1, seed=3))
        assert_same_or_near_tie(reference, llm.generate(prompts, params), "TP=2 with dynamic tiers")
        print(engine.controller.counts, engine.controller.refused)
        assert engine.controller.counts["promote"] >= 2 and engine.controller.counts["demote"] >= 2, \
            engine.controller.counts
        assert_no_run_or_slab_lost(engine, layers=2)
    finally:
        engine.close()


def test_gh200_profile_with_default_offload_starts_with_two_ranks(llama):
    path, reference = llama
    llm = tp_llm(path, 2, platform="gh200-96g", device_memory_budget=8 << 20, num_kv_blocks=None)
    try:
        assert llm.engine.plan.dynamic and llm.engine.controller is not None
        assert_same_or_near_tie(reference, llm.generate(PROMPTS, GREEDY), "TP=2 on gh200-96g, --offload auto")
        assert placement(llm.engine.store) == llm.engine.runner.placement.sent
    finally:
        llm.engine.close()
