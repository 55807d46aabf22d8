import pytest

from gh200rt.kv.block_pool import BlockPool


def test_allocate_takes_lowest_free_ids_in_order():
    pool = BlockPool(4)
    assert pool.allocate(2) == [0, 1]
    assert pool.num_free == 2
    assert [pool.blocks[i].ref_count for i in range(4)] == [1, 1, 0, 0]


def test_allocate_more_than_free_raises_and_takes_nothing():
    pool = BlockPool(2)
    with pytest.raises(RuntimeError, match="asked for 3"):
        pool.allocate(3)
    assert pool.num_free == 2


def test_release_returns_blocks_in_lru_order_and_refcounts():
    pool = BlockPool(4)
    a = pool.allocate(3)
    pool.touch(a[1])
    assert pool.blocks[a[1]].ref_count == 2
    pool.release([a[2], a[1], a[0]])
    assert pool.blocks[a[1]].ref_count == 1
    # block 3 was never used; 2 then 0 were freed after it.
    assert pool.free_order() == [3, 2, 0]
    pool.release([a[1]])
    assert pool.free_order() == [3, 2, 0, 1]
    assert pool.allocate(2) == [3, 2]


def test_cached_free_block_is_revived_by_touch_and_evicted_on_reuse():
    pool = BlockPool(2)
    [b] = pool.allocate(1)
    assert pool.register(b, 1234, (1, 2), None)
    pool.release([b])
    assert pool.num_cached_free == 1
    assert pool.lookup(1234, (1, 2), None) == b
    pool.touch(b)
    assert pool.num_free == 1 and pool.blocks[b].ref_count == 1
    pool.release([b])
    # Both blocks are free; the other one (1) is older, so it goes first, then b is evicted.
    assert pool.allocate(1) == [1]
    assert pool.lookup(1234, (1, 2), None) == b
    assert pool.allocate(1) == [b]
    assert pool.lookup(1234, (1, 2), None) is None
    assert pool.num_evictions == 1


def test_lookup_confirms_tokens_and_parent_not_just_hash():
    pool = BlockPool(3)
    p, c = pool.allocate(2)
    pool.register(p, 1, (5,), None)
    pool.register(c, 2, (6,), pool.identity(p))
    assert pool.lookup(2, (6,), pool.identity(p)) == c
    assert pool.lookup(2, (7,), pool.identity(p)) is None        # same hash, other tokens
    assert pool.lookup(2, (6,), (p, pool.blocks[p].epoch + 1)) is None   # parent reused since
    assert not pool.register(pool.allocate(1)[0], 2, (9,), None)  # hash taken: not published


def test_release_too_often_is_an_internal_error():
    pool = BlockPool(1)
    with pytest.raises(AssertionError):
        pool.release([0])


def test_cached_free_count_matches_a_scan_under_random_operations():
    import random
    rng = random.Random(0)
    pool = BlockPool(12)
    held: list[int] = []
    next_hash = 0
    for _ in range(2000):
        op = rng.randrange(4)
        if op == 0 and pool.num_free:
            held += pool.allocate(rng.randint(1, min(3, pool.num_free)))
        elif op == 1 and held:
            pool.release([held.pop(rng.randrange(len(held)))])
        elif op == 2 and held:
            next_hash += 1
            pool.register(rng.choice(held), next_hash, (next_hash,), None)
        elif op == 3 and pool.num_free:
            block_id = rng.choice(pool.free_order())
            pool.touch(block_id)
            held.append(block_id)
        scan = sum(1 for b in pool.free_order() if pool.blocks[b].block_hash is not None)
        assert pool.num_cached_free == scan
