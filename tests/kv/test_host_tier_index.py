"""The host KV tier's index: an LRU of stored blocks, found only once stored, confirmed against tokens, parent and
salt, and never overwritten while a load holds a block."""
import pytest

from gh200rt.kv.host_tier import HostBlockIndex

ROOT = ("salt", 0)


def store(index, block_hash, tokens, parent=ROOT, stored=True):
    slot = index.reserve(block_hash, tokens, parent)
    assert slot is not None
    index.finish_store(block_hash, slot, stored)
    return slot


def test_a_block_is_found_only_once_its_copy_finished():
    index = HostBlockIndex(4)
    slot = index.reserve(10, (1, 2), ROOT)
    assert index.lookup_chain([(10, (1, 2))], ROOT) == []          # the copy is still running
    index.finish_store(10, slot, stored=True)
    [block] = index.lookup_chain([(10, (1, 2))], ROOT)
    assert block.slot == slot and block.pins == 1
    assert index.reserve(10, (1, 2), ROOT) is None                   # already there: no second copy


def test_a_walk_confirms_tokens_parent_and_salt():
    index = HostBlockIndex(4)
    store(index, 10, (1, 2))
    store(index, 11, (3, 4), ("hash", 10))
    assert [b.token_ids for b in index.lookup_chain([(10, (1, 2)), (11, (3, 4))], ROOT)] == [(1, 2), (3, 4)]
    assert index.lookup_chain([(10, (9, 9))], ROOT) == []             # a colliding hash with other tokens
    assert index.lookup_chain([(10, (1, 2))], ("salt", 7)) == []      # another adapter's or salt's chain
    [first] = index.lookup_chain([(10, (1, 2)), (11, (3, 5))], ROOT)  # stops at the first miss
    assert first.token_ids == (1, 2)


def test_the_least_recently_used_block_makes_room():
    index = HostBlockIndex(2)
    store(index, 1, (1,))
    store(index, 2, (2,))
    index.unpin(index.lookup_chain([(1, (1,))], ROOT))               # block 1 is used again: 2 is now the oldest
    index.finish_store(3, index.reserve(3, (3,), ROOT), True)
    assert index.lookup_chain([(2, (2,))], ROOT) == []
    assert [b.token_ids for b in index.lookup_chain([(1, (1,))], ROOT)] == [(1,)]
    assert index.stats.evicted_blocks == 1


def test_a_pinned_block_is_never_evicted_and_a_full_tier_drops_the_store():
    index = HostBlockIndex(1)
    store(index, 1, (1,))
    [block] = index.lookup_chain([(1, (1,))], ROOT)
    assert index.reserve(2, (2,), ROOT) is None and index.stats.dropped_stores == 1
    index.unpin([block])
    assert index.reserve(2, (2,), ROOT) == block.slot


def test_a_dropped_store_frees_its_slot():
    index = HostBlockIndex(1)
    store(index, 1, (1,), stored=False)
    assert index.lookup_chain([(1, (1,))], ROOT) == []
    assert index.reserve(2, (2,), ROOT) == 0


def test_no_slots_is_refused():
    with pytest.raises(ValueError, match="at least one block"):
        HostBlockIndex(0)
