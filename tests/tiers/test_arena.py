"""The device arena shared by resident layer weights and the KV cache: a demoted layer's blocks go to the KV
cache, a promotion never takes a block a request holds (cached prefixes are evicted instead), no address
moves across tier changes, and the ledger shows the split."""
import random

import pytest
import torch

from gh200rt.kv.arena import DeviceArena
from gh200rt.kv.block_pool import BlockPool
from gh200rt.sampling_params import SamplingParams
from gh200rt.weights.store import NoFreeRun
from gh200rt.weights.tiers import LAYER_TIERS, Tier
from tests.tiers.test_engine_placement import engine, tiny_dir  # noqa: F401 (fixture)


def test_a_run_is_the_highest_window_of_free_blocks_and_evicts_cached_prefixes():
    pool = BlockPool(10)
    held = pool.allocate(8)                 # blocks 0-7
    pool.register(6, 1234, (1, 2), None)
    pool.release([held[6], held[2]])         # 6 (cached) and 2 are free again; 8, 9 never used
    assert pool.take_run(3) is None          # no window of 3 free blocks: 2 | 6, 8, 9 with 7 held between
    assert pool.take_run(2) == 8
    assert pool.runs == {8: 2} and pool.num_free == 2
    pool.release([held[7]])
    assert pool.take_run(2) == 6             # 6-7: the cached prefix in 6 is evicted, 2 is left alone
    assert 1234 not in pool.cached and pool.num_cached_free == 0
    assert sorted(pool.free_order()) == [2]
    pool.return_run(6)
    assert pool.free_order()[:2] == [6, 7] and pool.allocate(2) == [6, 7]   # the KV cache gets them first


def test_the_reserve_is_allocated_last_so_a_promotion_finds_its_window():
    pool = BlockPool(12)
    assert pool.take_run(2) == 10
    pool.set_reserve(4)                      # blocks 6-9: the four highest no run holds
    held = pool.allocate(6)
    assert sorted(held) == [0, 1, 2, 3, 4, 5]
    pool.release(held[::2])                  # 0, 2, 4 free again, scattered
    assert pool.allocate(3) == [0, 2, 4]     # still below the reserve, in LRU order
    assert pool.take_run(4) == 6             # the reserve is a whole window for the next promotion
    assert pool.runs == {6: 4, 10: 2} and pool.num_free == 0
    pool.return_run(6)                       # the boundary follows the runs: 6-9 are the reserve again
    pool.release([1, 3])
    assert pool.free_order() == [1, 3, 6, 7, 8, 9]
    assert pool.allocate(4) == [1, 3, 6, 7]  # under pressure the KV cache takes the reserve too
    pool.set_reserve(0)
    assert pool.free_order() == [8, 9] and pool.num_free == 2


def test_a_demoted_layers_blocks_go_to_the_kv_cache(tiny_dir):  # noqa: F811
    eng = engine(tiny_dir, offload="none")
    pool, ledger = eng.kv.pool, eng.ledger
    kv_before, weights_before = ledger.by_kind["kv_pool"], ledger.by_kind["arena_weights"]
    assert eng.plan.arena_weight_blocks == pool.num_run_blocks > 0
    assert "device arena" in eng.plan.explain()
    start = eng.store._runs[3]
    run = list(range(start, start + pool.runs[start]))
    total = eng.stats().kv_blocks_total
    with pytest.raises(ValueError, match="without a staging ring"):
        eng.store.set_tier(3, Tier.STREAMED)
    assert eng.store.tiers[3] == Tier.RESIDENT and pool.runs[start] == len(run)
    eng.store.set_tier(3, Tier.DIRECT)
    assert eng.stats().kv_blocks_total == total + len(run)
    assert ledger.by_kind["kv_pool"] == kv_before + len(run) * eng.store.arena.block_bytes
    assert ledger.by_kind["arena_weights"] == weights_before - len(run) * eng.store.arena.block_bytes
    assert pool.allocate(len(run)) == run
    eng.close()


def test_a_promotion_never_takes_a_block_a_request_holds(tiny_dir):  # noqa: F811
    eng = engine(tiny_dir, offload="stream", staging_slots=2, prefetch_distance=1, num_kv_blocks=8)
    pool = eng.kv.pool
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    eng.add_request("long", None, params, prompt_token_ids=list(range(3, 60)))
    eng.step()
    held = set(next(iter(eng.scheduler.running)).block_ids)
    free_windows = [b for b in range(pool.num_blocks) if b not in held]
    needed = eng.store.arena.blocks_for(eng.store.slabs[0].layout.nbytes)
    promoted, refused = 0, 0
    for layer in range(6):
        try:
            eng.store.set_tier(layer, Tier.RESIDENT)
            promoted += 1
        except NoFreeRun:
            refused += 1
        runs = {b for start, n in pool.runs.items() for b in range(start, start + n)}
        assert not runs & held
    assert promoted == (len(free_windows) - 0) // needed and refused == 6 - promoted
    while eng.has_unfinished_requests():
        eng.step()
    eng.close()


def test_no_arena_address_moves_across_100_tier_changes(tiny_dir):  # noqa: F811
    eng = engine(tiny_dir, offload="none", layer_tiers="1:streamed,4:streamed", staging_slots=2, prefetch_distance=1)
    store = eng.store
    addresses = lambda: ([c.data_ptr() for c in eng.runner.kv_caches] + [store.arena.buffer.data_ptr()]  # noqa: E731
                         + [s.data_ptr() for s in store.backend.slots])
    before = addresses()
    rng = random.Random(5)
    params = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    for change in range(100):
        try:
            store.set_tier(rng.randrange(6), rng.choice(list(LAYER_TIERS)))
        except NoFreeRun:
            pass
        if change % 10 == 0:
            eng.add_request(str(change), None, params, prompt_token_ids=[5 + change % 50, 6, 7])
        eng.step()
        assert addresses() == before
    for layer, start in store._runs.items():
        weight = eng.runner.model.layer_weight_refs(layer)["mlp.down_proj"].current
        run = store.arena.run(start)
        assert run.data_ptr() <= weight.data_ptr() < run.data_ptr() + run.nbytes
    eng.close()


@pytest.mark.parametrize("offload", ["none", "stream"])
def test_the_ledger_books_the_arena_once(tiny_dir, offload):  # noqa: F811
    eng = engine(tiny_dir, offload=offload)
    ledger, arena = eng.ledger, eng.store.arena
    assert ledger.by_kind["kv_pool"] + ledger.by_kind["arena_weights"] == arena.nbytes
    assert ledger.by_kind["arena_weights"] == arena.pool.num_run_blocks * arena.block_bytes
    assert ledger.used <= ledger.capacity
    eng.close()


def test_a_run_taken_at_a_given_block_is_that_run():
    """A tensor-parallel worker repeats rank 0's promotion at rank 0's run (distributed/placement_sync.py)."""
    arena = DeviceArena(8, 1, 2, 1, 4, torch.float32)
    with arena.taking_at(2):
        assert arena.take_run(arena.block_bytes * 3) == 2
    assert arena.pool.runs == {2: 3} and arena.take_run(arena.block_bytes) == 7      # the highest free window again
    with pytest.raises(AssertionError, match="not all free"), arena.taking_at(4):
        arena.take_run(arena.block_bytes * 2)
