"""The KV disk tier: a block stored in the host tier is written to disk off the step's path; after a restart (a new
offloader over the same directory) a lookup past host memory queues its read into a host slot on the reader thread,
and a later lookup finds it there; it loads bit for bit; tokens and parents confirm a block as in host memory; the
least recently used blocks go beyond the size; a directory of another layout is refused; a damaged file is skipped,
never read, and one that breaks during a read is forgotten."""
import threading
import time

import numpy as np
import pytest
import torch

from gh200rt.kv.disk_tier import DiskTier
from gh200rt.kv.offload import HostLookup, KVOffloader, PoolBlocks
from tests.kv.test_kv_offload import caches

ROOT = ("salt", 0)
IDENTITY = {"format": 1, "model": "tiny", "kv_dtype": "torch.float32", "block_shape": [3, 2, 4, 2, 8],
            "block_size": 4, "hash": "sha256"}


def offloader(kv, directory, capacity=1 << 20, identity=IDENTITY) -> KVOffloader:
    o = KVOffloader(PoolBlocks(kv), 4)
    o.disk = DiskTier(directory, capacity, o.block_bytes, 4, identity)
    return o


def offloader_over_one_stored_block(directory) -> KVOffloader:
    """A new engine's tier over a directory where an earlier one stored block 101 (tokens 1-4, the chain's first)."""
    kv = caches()
    first = offloader(kv, directory)
    first.store(1, 101, (1, 2, 3, 4), ROOT)
    first.wait_for_stores()
    first.close()
    return offloader(kv, directory)


def test_blocks_come_back_from_disk_after_a_restart_bit_for_bit(tmp_path):
    kv = caches()
    want = [[c[:, b].clone() for c in kv] for b in (1, 2)]
    first = offloader(kv, tmp_path)
    first.store(1, 101, (1, 2, 3, 4), ROOT)
    first.store(2, 102, (5, 6, 7, 8), ("hash", 101))
    first.wait_for_stores()
    first.close()
    assert first.disk.stats.written_blocks == 2 and len(list(tmp_path.glob("*.kv"))) == 2

    for c in kv:
        c.zero_()
    again = offloader(kv, tmp_path)                       # a new process: its host tier is empty
    assert len(again.disk.blocks) == 2 and again.index.num_ready == 0
    chain = [(101, (1, 2, 3, 4)), (102, (5, 6, 7, 8))]
    assert again.lookup_chain([(101, (1, 2, 3, 9))], ROOT, 4) == HostLookup([])   # other tokens: not this block
    assert again.lookup_chain(chain, ("salt", 7), 4) == HostLookup([])           # another salt: not this chain
    assert again.lookup_chain(chain, ROOT, 4) == HostLookup([], reading=True)    # queued for the reader thread
    assert again.wait_for_disk_reads(timeout=30)
    found = again.lookup_chain(chain, ROOT, 4).found
    assert [b.token_ids for b in found] == [(1, 2, 3, 4), (5, 6, 7, 8)] and all(b.pins == 1 for b in found)
    again.load([(found[0], 4), (found[1], 5)])
    assert all(torch.equal(c[:, 4], w) for c, w in zip(kv, want[0]))
    assert all(torch.equal(c[:, 5], w) for c, w in zip(kv, want[1]))
    assert again.disk.stats.hit_blocks == 2 and again.index.num_ready == 2   # now in host memory too
    assert again.report().disk.hit_blocks == 2 and again.report().disk_blocks == 2
    again.close()


def test_the_least_recently_used_blocks_leave_beyond_the_size(tmp_path):
    block_bytes = 3 * 2 * 4 * 2 * 8 * 4
    disk = DiskTier(tmp_path, 2 * (block_bytes + 200), block_bytes, 4, IDENTITY)
    data = np.zeros(block_bytes, dtype=np.uint8)
    for h in (1, 2):
        disk.write(h, (h,), ROOT, data)
    assert disk.lookup(1, (1,), ROOT) is not None      # 1 is now the most recently used
    disk.write(3, (3,), ROOT, data)
    assert sorted(disk.blocks) == [1, 3] and disk.stats.evicted_blocks == 1
    assert len(list(tmp_path.glob("*.kv"))) == 2


def test_a_directory_of_another_layout_is_refused_and_a_damaged_file_skipped(tmp_path):
    block_bytes = 3 * 2 * 4 * 2 * 8 * 4
    disk = DiskTier(tmp_path, 1 << 20, block_bytes, 4, IDENTITY)
    disk.write(5, (1, 2, 3, 4), ROOT, np.arange(block_bytes, dtype=np.uint8))
    disk.write(6, (1, 2, 3, 5), ROOT, np.arange(block_bytes, dtype=np.uint8))
    with pytest.raises(ValueError, match=r"holds KV blocks of another model or layout \(block_size: 4 there, 8 "
                                         r"here\); give an empty directory"):
        DiskTier(tmp_path, 1 << 20, block_bytes, 8, {**IDENTITY, "block_size": 8})
    damaged = disk.blocks[6].path
    damaged.write_bytes(damaged.read_bytes()[:20])
    reopened = DiskTier(tmp_path, 1 << 20, block_bytes, 4, IDENTITY)
    assert sorted(reopened.blocks) == [5]
    out = np.empty(block_bytes, dtype=np.uint8)
    assert reopened.read_into(reopened.blocks[5], out) and np.array_equal(out, np.arange(block_bytes, dtype=np.uint8))


def test_metrics_carry_the_disk_tier_beside_the_host_tier(tmp_path):
    from gh200rt.serve.metrics import host_tier_lines
    kv = caches()
    o = offloader(kv, tmp_path)
    o.store(1, 101, (1, 2, 3, 4), ROOT)
    o.wait_for_stores()
    text = "\n".join(host_tier_lines(o.report()))
    o.close()
    assert "gh200rt_kv_disk_blocks 1" in text and "gh200rt_kv_disk_written_blocks_total 1" in text
    assert "gh200rt_kv_host_stored_blocks_total 1" in text
    plain = KVOffloader(PoolBlocks(caches()), 4)
    assert "kv_disk" not in "\n".join(host_tier_lines(plain.report()))
    plain.close()


def test_a_lookup_never_waits_for_a_disk_read(tmp_path, monkeypatch):
    """A read held up (a slow disk) leaves lookups answering at once: the blocks being read are reported as such, the
    host blocks before them are not held, and once the read is done a lookup finds the whole chain."""
    kv = caches()
    first = offloader(kv, tmp_path)
    for block, (h, tokens, parent) in enumerate([(101, (1, 2, 3, 4), ROOT), (102, (5, 6, 7, 8), ("hash", 101))]):
        first.store(block + 1, h, tokens, parent)
    first.wait_for_stores()
    first.close()
    again = offloader(kv, tmp_path)
    again.store(1, 101, (1, 2, 3, 4), ROOT)            # the first block is in host memory, the second on disk only
    again.wait_for_stores()
    release, reading = threading.Event(), threading.Event()
    read_into = again.disk.read_into

    def slow_read(block, out):
        reading.set()
        assert release.wait(timeout=30)
        return read_into(block, out)
    monkeypatch.setattr(again.disk, "read_into", slow_read)
    chain = [(101, (1, 2, 3, 4)), (102, (5, 6, 7, 8))]
    lookup = again.lookup_chain(chain, ROOT, 4)
    assert [b.token_ids for b in lookup.found] == [(1, 2, 3, 4)] and lookup.reading
    again.index.unpin(lookup.found)
    assert reading.wait(timeout=30) and again.reading_from_disk
    assert again.lookup_chain(chain, ROOT, 4).reading, "asked again while the read runs: still reading"
    from gh200rt.serve.metrics import host_tier_lines
    assert "gh200rt_kv_disk_reading_blocks 1" in "\n".join(host_tier_lines(again.report()))
    assert not again.wait_for_disk_reads(timeout=0.01)
    release.set()
    assert again.wait_for_disk_reads(timeout=30) and not again.reading_from_disk
    lookup = again.lookup_chain(chain, ROOT, 4)
    assert len(lookup.found) == 2 and not lookup.reading and again.disk.stats.hit_blocks == 1
    again.close()


def test_a_read_finishing_during_a_lookup_is_found_or_waited_for(tmp_path, monkeypatch):
    """A read that finishes between a lookup's walk of host memory (the block not there yet) and its look at the
    reads under way: the lookup still says reading (the next one finds the block), never neither, which would have its
    request recompute blocks just read for it."""
    again = offloader_over_one_stored_block(tmp_path)
    release, reading = threading.Event(), threading.Event()
    read_into = again.disk.read_into

    def held_read(block, out):
        reading.set()
        return release.wait(timeout=30) and read_into(block, out)
    monkeypatch.setattr(again.disk, "read_into", held_read)
    chain = [(101, (1, 2, 3, 4))]
    assert again.lookup_chain(chain, ROOT, 4) == HostLookup([], reading=True)
    assert reading.wait(timeout=30), "the reader thread took the read"
    walk = again.index.lookup_chain

    def walk_then_let_the_read_finish(*args):
        found = walk(*args)
        monkeypatch.setattr(again.index, "lookup_chain", walk)      # once
        release.set()
        deadline = time.monotonic() + 30
        while not again.index.blocks[101].ready and time.monotonic() < deadline:
            time.sleep(0.001)
        deadline = time.monotonic() + 0.5      # the reader may also leave the reads under way if nothing stops it
        while again._reading and time.monotonic() < deadline:
            time.sleep(0.001)
        return found
    monkeypatch.setattr(again.index, "lookup_chain", walk_then_let_the_read_finish)
    assert again.lookup_chain(chain, ROOT, 4) == HostLookup([], reading=True)
    assert again.index.blocks[101].ready
    assert again.wait_for_disk_reads(timeout=30)
    assert [b.token_ids for b in again.lookup_chain(chain, ROOT, 4).found] == [(1, 2, 3, 4)]
    again.close()


def test_a_file_that_breaks_during_its_read_is_forgotten(tmp_path):
    again = offloader_over_one_stored_block(tmp_path)
    path = again.disk.blocks[101].path
    path.write_bytes(path.read_bytes()[:-8])           # cut short after the engine scanned the directory
    assert again.lookup_chain([(101, (1, 2, 3, 4))], ROOT, 4).reading
    assert again.wait_for_disk_reads(timeout=30)
    assert again.lookup_chain([(101, (1, 2, 3, 4))], ROOT, 4) == HostLookup([]), "a broken file is read again"
    assert 101 not in again.disk.blocks and not path.exists() and again.index.num_ready == 0
    assert again.disk.stats.failed_reads == 1
    again.close()
