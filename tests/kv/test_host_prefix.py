"""The prefix cache continued in the host KV tier: published blocks stored, a device miss found there, adopted,
given device blocks and loaded before they are read; salts isolated; write-back stores what is freed."""
import pytest
import torch

from gh200rt.kv.kv_manager import KVCacheManager, chain_hash, chain_root, sha256_chain_hash
from gh200rt.kv.offload import KVOffloader, PoolBlocks

BS = 4


class Req:
    def __init__(self, tokens, salt=0):
        self.prompt_token_ids = list(tokens)
        self.all_token_ids = list(tokens)
        self.block_ids, self.block_hashes, self.host_blocks = [], [], []
        self.num_computed_tokens = 0
        self.cache_salt = salt


def setup(num_blocks=4, policy="write_through"):
    gen = torch.Generator().manual_seed(0)
    kv_caches = [torch.randn(2, num_blocks, BS, 1, 4, generator=gen) for _ in range(2)]
    offload = KVOffloader(PoolBlocks(kv_caches), 16)
    kv = KVCacheManager(num_blocks, BS)
    kv.attach_host_tier(offload, policy)
    return kv, kv_caches, offload


def compute(kv, req, kv_caches, value):
    """Run the request's prompt: its blocks hold ``value`` + position, then publish them."""
    assert kv.allocate(req, len(req.all_token_ids) - req.num_computed_tokens)
    for i, block_id in enumerate(req.block_ids):
        for cache in kv_caches:
            if i * BS >= req.num_computed_tokens:
                cache[:, block_id] = value + i
    req.num_computed_tokens = len(req.all_token_ids)
    kv.publish_full_blocks(req)


def admit(kv, req):
    """What the scheduler does for a waiting request: device hit, then the host tier, then its blocks."""
    ids, hashes = kv.find_cached_prefix(req.all_token_ids, req.cache_salt)
    if ids:
        kv.adopt_prefix(req, ids, hashes)
    found = kv.find_host_prefix(req, hashes)
    if found:
        kv.adopt_host_prefix(req, found)
    assert kv.allocate(req, len(req.all_token_ids) - req.num_computed_tokens)
    kv.start_host_loads(req)
    return len(ids), len(found)


def test_an_evicted_prefix_comes_back_from_the_host_tier_with_its_bytes():
    kv, kv_caches, offload = setup()
    first = Req(range(13))                           # 3 full blocks + 1 token
    compute(kv, first, kv_caches, 100.0)
    offload.wait_for_stores()
    kept = {i: [c[:, b].clone() for c in kv_caches] for i, b in enumerate(first.block_ids[:3])}
    kv.free(first)
    other = Req(range(50, 66))                       # takes every device block: the cached prefix is evicted
    compute(kv, other, kv_caches, -1.0)
    kv.free(other)
    again = Req(list(range(13)) + [99, 98])
    assert admit(kv, again) == (0, 3)                # nothing on the device, three blocks in host memory
    assert again.num_computed_tokens == 12 and len(again.block_hashes) == 3
    kv.run_host_loads()
    for i, block_id in enumerate(again.block_ids[:3]):
        assert all(torch.equal(c[:, block_id], k) for c, k in zip(kv_caches, kept[i]))
    assert offload.index.stats.hit_tokens == 12
    # the loaded blocks are published on the device: the next request finds them there
    kv.free(again)
    assert admit(kv, Req(range(13))) == (3, 0)
    offload.close()


def test_a_device_hit_continues_in_the_host_tier():
    kv, kv_caches, offload = setup(num_blocks=8)
    first = Req(range(17))
    compute(kv, first, kv_caches, 1.0)
    offload.wait_for_stores()
    kv.free(first)
    # the pool hands out its never-used blocks, then the freed ones tail first: chain blocks 4, 3 and 2 go,
    # 0 and 1 stay cached on the device
    kv.pool.release(kv.pool.allocate(6)[::-1])
    assert admit(kv, Req(range(18))) == (2, 2)
    offload.close()


def test_another_salt_finds_nothing_in_the_host_tier():
    kv, kv_caches, offload = setup()
    first = Req(range(9), salt=5)
    compute(kv, first, kv_caches, 1.0)
    offload.wait_for_stores()
    kv.free(first)
    other = Req(range(40, 56))
    compute(kv, other, kv_caches, 0.0)               # every device block reused
    kv.free(other)
    assert admit(kv, Req(range(9), salt=6)) == (0, 0)
    offload.close()


def test_write_back_stores_a_block_when_its_last_reference_goes():
    kv, kv_caches, offload = setup(policy="write_back")
    first = Req(range(9))
    compute(kv, first, kv_caches, 1.0)
    offload.wait_for_stores()
    assert offload.index.stats.stored_blocks == 0    # published, still held: not yet
    kv.free(first)
    offload.wait_for_stores()
    assert offload.index.stats.stored_blocks == 2
    offload.close()


def test_a_request_freed_before_its_blocks_lets_go_of_the_host_blocks():
    kv, kv_caches, offload = setup()
    first = Req(range(9))
    compute(kv, first, kv_caches, 1.0)
    offload.wait_for_stores()
    kv.free(first)
    compute(kv, Req(range(40, 56)), kv_caches, 0.0)
    req = Req(range(10))
    found = kv.find_host_prefix(req, [])
    kv.adopt_host_prefix(req, found)
    assert all(block.pins == 1 for block, _ in found)
    kv.free(req)                                     # admission failed: allocate was never reached
    assert all(block.pins == 0 for block, _ in found) and req.host_blocks == []
    offload.close()


def test_the_sha256_chain_is_the_same_in_every_process_and_version():
    h = sha256_chain_hash(None, (1, 2, 3))
    assert h == 0xE91B8C5495FAA0B3                   # a constant: what any process, any Python, computes
    assert sha256_chain_hash(h, (4,)) != sha256_chain_hash(None, (4,))
    assert chain_root(5, sha256_chain_hash)[0] != chain_root(6, sha256_chain_hash)[0]
    assert chain_root(5, chain_hash)[1] == (-1, 5)


@pytest.mark.parametrize("block_major", [True, False], ids=["arena", "per-layer caches"])
def test_a_steps_loads_reach_each_layer_just_before_it_runs(block_major):
    """``take_host_loads``: layer N's share of the blocks is copied when layer N is made ready, not before; the host
    blocks stay held until the step finishes, then the load is counted."""
    gen = torch.Generator().manual_seed(0)
    arena = torch.randn(4, 3, 2, BS, 1, 4, generator=gen)            # [blocks, layers, planes, ...]
    kv_caches = [arena[:, layer].transpose(0, 1) for layer in range(3)]
    offload = KVOffloader(PoolBlocks(kv_caches, arena if block_major else None), 16)
    kv = KVCacheManager(4, BS)
    kv.attach_host_tier(offload, "write_through")
    first = Req(range(9))
    compute(kv, first, kv_caches, 100.0)
    offload.wait_for_stores()
    kept = [[c[:, b].clone() for c in kv_caches] for b in first.block_ids[:2]]
    kv.free(first)
    other = Req(range(50, 66))
    compute(kv, other, kv_caches, -1.0)    # every device block overwritten: the prefix is evicted
    kv.free(other)
    again = Req(list(range(9)) + [7])
    assert admit(kv, again) == (0, 2)
    targets = again.block_ids[:2]
    loads = kv.take_host_loads()
    assert kv.take_host_loads() is None, "a step's loads are taken once"

    def loaded(layer):
        return [torch.equal(kv_caches[layer][:, b], kept[i][layer]) for i, b in enumerate(targets)]
    assert not any(loaded(0) + loaded(1) + loaded(2)), "nothing is copied before the first layer runs"
    loads.ready(0)
    assert all(loaded(0)) and not any(loaded(1) + loaded(2))
    loads.ready(1)
    assert all(loaded(1)) and not any(loaded(2))
    assert offload.index.stats.loaded_blocks == 0 and all(block.pins for block, _ in loads.pairs)
    loads.finish()
    assert all(loaded(2)) and offload.index.stats.loaded_blocks == 2
    assert not any(block.pins for block, _ in loads.pairs), "the host blocks are let go of"
    offload.close()
