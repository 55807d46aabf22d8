from gh200rt.kv.kv_manager import KVCacheManager, chain_hash


class Req:
    def __init__(self, tokens):
        self.all_token_ids = list(tokens)
        self.block_ids = []
        self.block_hashes = []
        self.num_computed_tokens = 0


def compute(kv, req, n):
    assert kv.allocate(req, n)
    req.num_computed_tokens += n
    kv.publish_full_blocks(req)


def test_hashes_chain_over_parents():
    kv = KVCacheManager(8, 4)
    r = Req(range(10))
    compute(kv, r, 10)
    h0 = chain_hash(None, (0, 1, 2, 3))
    assert r.block_hashes == [h0, chain_hash(h0, (4, 5, 6, 7))]
    assert len(r.block_ids) == 3           # the partial third block is never published
    assert kv.pool.blocks[r.block_ids[2]].block_hash is None


def test_a_position_computed_before_its_token_is_known_is_published_once_the_token_is():
    """A step launched ahead (--async-scheduling) counts position 7 computed while the request holds 7 tokens."""
    kv = KVCacheManager(8, 4)
    r = Req(range(7))
    compute(kv, r, 8)
    assert len(r.block_hashes) == 1 and len(r.block_ids) == 2
    r.all_token_ids.append(7)
    kv.publish_full_blocks(r)
    h0 = chain_hash(None, (0, 1, 2, 3))
    assert r.block_hashes == [h0, chain_hash(h0, (4, 5, 6, 7))]


def test_hit_reuses_full_blocks_but_always_leaves_last_token():
    kv = KVCacheManager(8, 4)
    a = Req(range(8))
    compute(kv, a, 8)
    b = Req(range(8))
    ids, hashes = kv.find_cached_prefix(b.all_token_ids)
    assert ids == a.block_ids[:1]          # 7 tokens may be reused -> one full block
    kv.adopt_prefix(b, ids, hashes)
    assert b.num_computed_tokens == 4
    assert kv.pool.blocks[ids[0]].ref_count == 2
    c = Req(list(range(8)) + [99])
    ids, _ = kv.find_cached_prefix(c.all_token_ids)
    assert ids == a.block_ids
    assert (kv.stats.lookups, kv.stats.hits, kv.stats.hit_tokens) == (2, 2, 12)


def test_different_prefix_same_block_tokens_misses():
    kv = KVCacheManager(8, 2)
    a = Req([1, 2, 3, 4, 5])
    compute(kv, a, 5)
    ids, _ = kv.find_cached_prefix([9, 9, 3, 4, 5])
    assert ids == []


def test_freed_blocks_stay_cached_and_are_evicted_lru_tail_first():
    kv = KVCacheManager(4, 2)
    a = Req([1, 2, 3, 4, 5])
    compute(kv, a, 5)
    blocks = list(a.block_ids)
    kv.free(a)
    assert kv.num_free_blocks == 4 and kv.pool.num_cached_free == 2
    # never-used block 3 first, then a's blocks tail-first.
    assert kv.pool.free_order() == [3, blocks[2], blocks[1], blocks[0]]
    ids, _ = kv.find_cached_prefix([1, 2, 3, 4, 7])
    assert ids == blocks[:2]
    kv.pool.allocate(3)                    # evicts block 3, blocks[2], then blocks[1] (the tail)
    ids, _ = kv.find_cached_prefix([1, 2, 3, 4, 7])
    assert ids == blocks[:1]


def test_forced_hash_collision_never_returns_wrong_block():
    kv = KVCacheManager(8, 2, hash_fn=lambda parent, tokens: 42)
    a = Req([1, 2, 3])
    compute(kv, a, 3)
    assert kv.pool.blocks[a.block_ids[0]].block_hash == 42
    ids, _ = kv.find_cached_prefix([7, 8, 9])          # same hash, different tokens
    assert ids == []
    b = Req([7, 8, 9])
    compute(kv, b, 3)                                  # its block cannot be published (hash taken)
    assert kv.pool.blocks[b.block_ids[0]].block_hash is None
    ids, _ = kv.find_cached_prefix([1, 2, 5])
    assert ids == a.block_ids[:1]


def test_prefix_caching_off_never_hits():
    kv = KVCacheManager(8, 2, enable_prefix_caching=False)
    a = Req([1, 2, 3])
    compute(kv, a, 3)
    assert kv.find_cached_prefix([1, 2, 3]) == ([], [])
    assert kv.stats.lookups == 0


def test_blocks_to_admit_counts_only_prefix_blocks_that_running_requests_hold():
    kv = KVCacheManager(16, 4)
    a = Req(range(12))
    compute(kv, a, 12)                                 # three full blocks, held by a
    waiting = list(range(8)) + [50, 51, 52, 53, 54]    # shares a's first two blocks, 13 tokens = 4 blocks
    hashes = kv.prefix_hashes(waiting)
    assert len(hashes) == 3 and hashes[:2] == a.block_hashes[:2]
    assert kv.blocks_to_admit(len(waiting), hashes) == 4 - 2
    kv.pool.release(a.block_ids[::-1])                 # a finishes: its blocks stay cached, but free
    assert kv.blocks_to_admit(len(waiting), hashes) == 4   # reviving a free block takes it off the free list
    assert KVCacheManager(16, 4, enable_prefix_caching=False).blocks_to_admit(13, hashes) == 4
