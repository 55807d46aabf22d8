"""The host KV tier with tensor parallelism on the CPU: rank 0 decides every store and load, each worker repeats them
on its own heads' share of the blocks before the step, so conversations whose blocks went to host memory and back
give TP=2 the tokens and logprobs a device hit gives it; the tier's size is the ranks' tiers together; read in
place, each rank reads its own share."""
from __future__ import annotations

import pytest

from gh200rt.distributed.launch import usable_cores
from tests.distributed.tiny_tp_models import save_tp_tiny, tp_llm
from tests.engine.test_host_kv_tier import conversations, synchronous_stores, talk

pytestmark = pytest.mark.skipif(usable_cores() < 2, reason="two ranks need two CPU cores")


def test_blocks_back_from_host_memory_give_tp2_a_device_hits_bits(tmp_path):
    path = save_tp_tiny("llama-gqa", str(tmp_path / "llama-gqa"))
    firsts = conversations(200, count=3, system=0)
    llm = tp_llm(path, 2, num_kv_blocks=64)
    try:
        want = talk(llm, firsts, turns=2, max_tokens=2)
        assert llm.engine.stats().prefix_cache_hit_tokens >= 3 * 48     # the second turns hit on the device
    finally:
        llm.engine.close()
    # 8 blocks hold two conversations: by their second turns the first two conversations' blocks were reused
    llm = tp_llm(path, 2, num_kv_blocks=8, kv_offloading_size="1MiB", kv_offloading_reads="load")
    try:
        synchronous_stores(llm)
        got = talk(llm, firsts, turns=2, max_tokens=2)
        host = llm.engine.stats().kv_host
        per_rank = llm.engine.host_tier.blocks.nbytes_per_block
        assert llm.engine.host_tier.index.num_blocks == (1 << 20) // (2 * per_rank)   # both ranks' shares in 1 MiB
    finally:
        llm.engine.close()
    assert got == want, "TP=2: tokens or logprobs differ with the host KV tier (a worker did not repeat a copy?)"
    assert host.hit_tokens >= 2 * 48 and host.loaded_blocks >= 6, host


def test_tp2_workers_read_their_share_of_host_blocks_in_place(tmp_path):
    """Rank 0's tables name host slots; each worker reads its own heads' share of them from its mirror of the tier,
    where rank 0's stores put them: the tokens and logprobs of loads."""
    path = save_tp_tiny("llama-gqa", str(tmp_path / "llama-gqa"))
    firsts = conversations(200, count=3, system=0)
    seen, host = {}, None
    for reads in ("load", "in_place"):
        llm = tp_llm(path, 2, num_kv_blocks=8, kv_offloading_size="1MiB", cpu_kernels="torch",
                     kv_offloading_reads=reads)
        try:
            synchronous_stores(llm)
            seen[reads] = talk(llm, firsts, turns=2, max_tokens=2)
            host = llm.engine.stats().kv_host
        finally:
            llm.engine.close()
    assert seen["in_place"] == seen["load"], "a worker read other bytes than rank 0's tables name"
    assert host.read_in_place_blocks >= 3 and host.loaded_blocks == 0, host
