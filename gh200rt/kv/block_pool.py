"""The pool of fixed-size KV blocks: ids, reference counts, and the LRU of free blocks.

A block is either in use (``ref_count > 0``) or free. Free blocks wait in LRU order; a free
block may still hold a cached prefix (its ``block_hash`` is set), so it can be revived by a
prefix-cache hit until it is handed out again, at which point its hash is dropped (evicted).

Block ids are addresses: in the device arena (``arena.py``) block i is the i-th ``block_bytes`` of one
buffer, so a run of consecutive ids is contiguous memory. ``take_run`` hands such a run to resident
weights: it is neither free nor in use by a request until ``return_run`` gives it back to the free
list. A run may evict cached prefixes (free blocks), never a block a request holds.

A promotion needs a whole window of free blocks, and the KV cache scatters requests' blocks over
the pool in LRU order. ``set_reserve(count)`` keeps the ``count`` highest blocks no run holds (where
promotions go: the streamed layers' runs) for last: the free list is split at that boundary, and
allocation takes the lower part (LRU) before the reserve (LRU), so under slack the reserve stays
free and a promotion finds its window; under pressure the KV cache uses it like any other block.
A block whose bytes a copy to the host KV tier still reads is not reused before the copy ends: allocation asks
``reuse_guard(block_id, wait)`` (kv/offload.py ``claim``) of every free block it takes, passes over one that is
busy for the next free block, and waits only when no other is free; a run of weights waits for its blocks.
``on_free_cached`` hears of every published block whose last reference is dropped (the write-back policy's store).
Pure Python and hardware-agnostic: ids only, no tensors.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable


@dataclass
class KVBlock:
    block_id: int
    ref_count: int = 0
    block_hash: int | None = None
    token_ids: tuple[int, ...] | None = None      # stored to confirm a hash hit exactly
    parent: tuple[int, int] | None = None          # (block_id, epoch) of the block before it in its chain
    parent_hash: int | None = None                 # that block's hash (None: the chain's root)
    epoch: int = 0                                 # bumped whenever the block gets new contents


class BlockPool:
    def __init__(self, num_blocks: int):
        if num_blocks < 1:
            raise ValueError(f"a KV pool needs at least one block, got {num_blocks}")
        self.blocks = [KVBlock(i) for i in range(num_blocks)]
        # Least recently freed first: allocation takes from the front, freeing appends at the back.
        # _free holds the blocks below the reserve boundary, _spare those at or above it (taken last).
        self._free: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        self._spare: OrderedDict[int, None] = OrderedDict()
        self._reserve_from = num_blocks
        self._reserve_count = 0
        self.cached: dict[int, int] = {}           # block_hash -> block_id
        self.num_evictions = 0
        self._num_cached_free = 0                   # free blocks that still hold a hash (kept O(1) for stats)
        self.runs: dict[int, int] = {}              # start -> length of every run resident weights hold
        self.reuse_guard: Callable[[int, bool], bool] | None = None
        self.on_free_cached: Callable[[KVBlock], None] | None = None

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free(self) -> int:
        return len(self._free) + len(self._spare)

    @property
    def num_cached_free(self) -> int:
        return self._num_cached_free

    def free_order(self) -> list[int]:
        """Free blocks in the order allocation takes them."""
        return list(self._free) + list(self._spare)

    def _list_of(self, block_id: int) -> OrderedDict[int, None]:
        return self._spare if block_id >= self._reserve_from else self._free

    def _is_free(self, block_id: int) -> bool:
        return block_id in self._free or block_id in self._spare

    def set_reserve(self, count: int) -> None:
        """Allocate the ``count`` highest blocks that no run holds last (0: no reserve). Kept across
        ``take_run`` / ``return_run`` as a count: the boundary follows the runs."""
        assert count >= 0, count
        self._reserve_count = count
        boundary, left = self.num_blocks, count
        in_run = {b for start, n in self.runs.items() for b in range(start, start + n)}
        while left and boundary:
            boundary -= 1
            left -= boundary not in in_run
        if boundary == self._reserve_from:
            return
        self._reserve_from = boundary
        order = list(self._free) + list(self._spare)
        self._free = OrderedDict((b, None) for b in order if b < boundary)
        self._spare = OrderedDict((b, None) for b in order if b >= boundary)

    def allocate(self, count: int) -> list[int]:
        if count > self.num_free:
            raise RuntimeError(f"asked for {count} KV blocks, {self.num_free} free")
        ids, busy = [], []
        while len(ids) < count:
            if self._free or self._spare:
                block_id, _ = (self._free if self._free else self._spare).popitem(last=False)
                if self.reuse_guard is not None and not self.reuse_guard(block_id, False):
                    busy.append(block_id)            # a copy still reads it: the next free block instead
                    continue
            else:                                    # every free block left is being copied: wait for the first
                block_id = busy.pop(0)
                self.reuse_guard(block_id, True)
            block = self.blocks[block_id]
            self._num_cached_free -= block.block_hash is not None
            self._evict(block)
            block.ref_count = 1
            block.epoch += 1
            ids.append(block_id)
        for block_id in reversed(busy):              # back where they were, first in line
            free = self._list_of(block_id)
            free[block_id] = None
            free.move_to_end(block_id, last=False)
        return ids

    def _evict(self, block: KVBlock) -> None:
        if block.block_hash is not None:
            if self.cached.get(block.block_hash) == block.block_id:
                del self.cached[block.block_hash]
            self.num_evictions += 1
        block.block_hash = block.token_ids = block.parent = block.parent_hash = None

    def touch(self, block_id: int) -> None:
        """Take one more reference (a prefix hit or a fork); revives a free cached block."""
        block = self.blocks[block_id]
        if block.ref_count == 0:
            del self._list_of(block_id)[block_id]
            self._num_cached_free -= block.block_hash is not None
        block.ref_count += 1

    def release(self, block_ids: list[int]) -> None:
        """Drop one reference each. Callers pass a table tail-first so the tail is evicted first."""
        for block_id in block_ids:
            block = self.blocks[block_id]
            assert block.ref_count > 0, f"block {block_id} released more often than taken"
            block.ref_count -= 1
            if block.ref_count == 0:
                self._list_of(block_id)[block_id] = None
                self._num_cached_free += block.block_hash is not None
                if block.block_hash is not None and self.on_free_cached is not None:
                    self.on_free_cached(block)

    @property
    def num_run_blocks(self) -> int:
        return sum(self.runs.values())

    def find_run(self, count: int) -> int | None:
        """The start of the highest run of ``count`` consecutive free blocks (weights gather at the top;
        the KV cache starts at the bottom), or None when a request holds a block in every window."""
        assert count > 0, count
        length = 0
        for block_id in range(self.num_blocks - 1, -1, -1):
            length = length + 1 if self._is_free(block_id) else 0
            if length == count:
                return block_id
        return None

    def take_run(self, count: int, at: int | None = None) -> int | None:
        """Take ``count`` consecutive free blocks for resident weights (evicting cached prefixes there);
        their start, or None when no such run is free. ``at``: the run must start there (every block free)."""
        start = self.find_run(count) if at is None else at
        if start is None:
            return None
        assert all(self._is_free(b) for b in range(start, start + count)) and start + count <= self.num_blocks, \
            f"blocks [{start}, {start + count}) are not all free"
        for block_id in range(start, start + count):
            if self.reuse_guard is not None:
                self.reuse_guard(block_id, True)    # weights overwrite it: a copy still reading it ends first
            del self._list_of(block_id)[block_id]
            block = self.blocks[block_id]
            self._num_cached_free -= block.block_hash is not None
            self._evict(block)
            block.epoch += 1                        # its bytes become weights: no hit may point at them
        self.runs[start] = count
        self.set_reserve(self._reserve_count)
        return start

    def return_run(self, start: int) -> None:
        """Give a run back: its blocks join the free list first in line, so the KV cache uses them first."""
        count = self.runs.pop(start)
        for block_id in range(start + count - 1, start - 1, -1):
            self.blocks[block_id].epoch += 1
            free = self._list_of(block_id)
            free[block_id] = None
            free.move_to_end(block_id, last=False)
        self.set_reserve(self._reserve_count)

    def register(self, block_id: int, block_hash: int, token_ids: tuple[int, ...],
                 parent: tuple[int, int] | None, parent_hash: int | None = None) -> bool:
        """Publish a full, computed block under its chained hash. False if the hash is taken."""
        block = self.blocks[block_id]
        if block.block_hash is not None or block_hash in self.cached:
            return False
        block.block_hash, block.token_ids, block.parent = block_hash, token_ids, parent
        block.parent_hash = parent_hash
        self.cached[block_hash] = block_id
        self._num_cached_free += block.ref_count == 0
        return True

    def lookup(self, block_hash: int, token_ids: tuple[int, ...], parent: tuple[int, int] | None) -> int | None:
        """The cached block with exactly these tokens after exactly this parent, or None."""
        block_id = self.cached.get(block_hash)
        if block_id is None:
            return None
        block = self.blocks[block_id]
        if block.token_ids != token_ids or block.parent != parent:
            return None                             # a hash collision: never trust the hash alone
        return block_id

    def identity(self, block_id: int) -> tuple[int, int]:
        return block_id, self.blocks[block_id].epoch
