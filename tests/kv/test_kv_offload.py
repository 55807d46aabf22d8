"""The host KV tier's copies: stores on their own thread, a device block never reused while a store reads it (a
queued store is dropped, a running one is waited for or passed over), loads restoring the exact bytes, and a failed
copy degrading the tier to recompute."""
import logging
import threading

import pytest
import torch

from gh200rt.kv.block_pool import BlockPool
from gh200rt.kv.offload import KVOffloader, PoolBlocks

ROOT = ("salt", 0)


class GatedBlocks(PoolBlocks):
    """Stores of the blocks in ``held`` wait until ``release`` (so a test sees a store running)."""

    def __init__(self, caches):
        super().__init__(caches)
        self.held, self.running, self.release = set(), threading.Event(), threading.Event()

    def read_many(self, block_ids, slots, non_blocking=False):
        if self.held.intersection(block_ids):
            self.running.set()
            assert self.release.wait(10)
        super().read_many(block_ids, slots, non_blocking)


def caches(num_blocks=6, layers=3):
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(2, num_blocks, 4, 2, 8, generator=gen) for _ in range(layers)]


@pytest.fixture
def offload():
    made = []

    def make(blocks, num_host_blocks=4):
        made.append(KVOffloader(blocks, num_host_blocks))
        return made[-1]
    yield make
    for o in made:
        if isinstance(o.blocks, GatedBlocks):
            o.blocks.release.set()
        o.close()


def test_a_stored_block_loads_back_bit_for_bit(offload):
    kv = caches()
    o = offload(PoolBlocks(kv))
    want = [c[:, 2].clone() for c in kv]
    o.store(2, 77, (1, 2, 3, 4), ROOT)
    o.wait_for_stores()
    for c in kv:
        c[:, 5].zero_()
    [block] = o.index.lookup_chain([(77, (1, 2, 3, 4))], ROOT)
    o.load([(block, 5)])
    assert all(torch.equal(c[:, 5], w) for c, w in zip(kv, want))
    assert block.pins == 0 and o.counters.loaded_bytes == o.block_bytes == sum(w.nbytes for w in want)


def test_block_major_and_per_layer_pools_move_the_same_bytes(offload):
    arena = torch.randn(6, 3, 2, 4, 2, 8, generator=torch.Generator().manual_seed(1))
    per_layer = [arena[:, layer].transpose(0, 1) for layer in range(3)]
    want = arena[[1, 4]].clone()
    for blocks in (PoolBlocks(per_layer), PoolBlocks(per_layer, block_major=arena)):
        o = offload(blocks)
        o.store(1, 10, (1,), ROOT)
        o.store(4, 11, (2,), ("hash", 10))
        o.wait_for_stores()
        found = o.index.lookup_chain([(10, (1,)), (11, (2,))], ROOT)
        arena[[0, 5]] = 0.0
        o.load([(found[0], 5), (found[1], 0)])
        assert torch.equal(arena[5], want[0]) and torch.equal(arena[0], want[1])


def test_a_queued_store_is_dropped_when_its_block_is_reused(offload):
    blocks = GatedBlocks(caches())
    blocks.held.add(0)
    o = offload(blocks)
    o.store(0, 10, (1,), ROOT)
    assert blocks.running.wait(10)           # the thread copies block 0 and waits there
    o.store(1, 11, (2,), ROOT)               # queued behind it
    assert o.claim(1)                        # block 1 is reused: its store never runs
    blocks.release.set()
    o.wait_for_stores()
    assert [b.token_ids for b in o.index.lookup_chain([(10, (1,))], ROOT)] == [(1,)]
    assert o.index.lookup_chain([(11, (2,))], ROOT) == []
    assert o.index.stats.dropped_stores == 1 and o.index.stats.stored_blocks == 1


def store_running(offload, num_blocks: int, block_id: int):
    """A pool of ``num_blocks`` guarded by an offloader whose store of ``block_id`` is running (and held there until
    ``blocks.release`` is set): (blocks, offloader, pool)."""
    blocks = GatedBlocks(caches(num_blocks=num_blocks))
    blocks.held.add(block_id)
    o = offload(blocks)
    pool = BlockPool(num_blocks)
    pool.reuse_guard = o.claim
    o.store(block_id, 10, (1,), ROOT)
    assert blocks.running.wait(10)
    return blocks, o, pool


def test_the_pool_passes_over_a_block_a_store_still_reads(offload):
    blocks, o, pool = store_running(offload, 6, 0)
    assert not o.claim(0)                    # running: not now
    assert pool.allocate(1) == [1]           # the next free block instead
    assert pool.free_order()[0] == 0         # block 0 keeps its place, first in line
    blocks.release.set()
    o.wait_for_stores()
    assert pool.allocate(1) == [0]


def test_with_no_other_free_block_the_pool_waits_for_the_copy(offload):
    blocks, o, pool = store_running(offload, 2, 1)
    assert pool.allocate(1) == [0]
    threading.Timer(0.2, blocks.release.set).start()
    assert pool.allocate(1) == [1]           # returned once the store ended
    assert [b.token_ids for b in o.index.lookup_chain([(10, (1,))], ROOT)] == [(1,)]


def test_a_run_of_weights_waits_for_a_store_of_its_blocks(offload):
    blocks, o, pool = store_running(offload, 4, 3)
    threading.Timer(0.2, blocks.release.set).start()
    assert pool.take_run(2) == 2             # blocks 2-3, after block 3's copy finished
    assert o.index.stats.stored_blocks == 1


def test_a_failed_copy_degrades_to_recompute_with_a_warning(offload, caplog):
    class Broken(PoolBlocks):
        def read_many(self, block_ids, slots, non_blocking=False):
            raise RuntimeError("out of host memory")
    o = offload(Broken(caches()))
    with caplog.at_level(logging.WARNING, logger="gh200rt.kv.offload"):
        o.store(0, 10, (1,), ROOT)
        o.wait_for_stores()
    assert "stops storing blocks" in caplog.text and "out of host memory" in caplog.text
    assert o.failed and o.index.lookup_chain([(10, (1,))], ROOT) == []
    o.store(1, 11, (2,), ROOT)               # nothing more is queued: no host block is even reserved
    assert o.index.stats.dropped_stores == 1 and not o.index.blocks
