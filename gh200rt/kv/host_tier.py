"""The host KV tier: full, published KV blocks kept in host memory after their device slots are reused.

An LRU of blocks over the same chained hashes as the device pool (``kv_manager.chain_hash``), each confirmed on a
lookup against its tokens and its parent exactly as the device pool confirms them: a block's parent is the hash of
the block before it in its chain, or for a chain's first block the chain's salt (``chain_root``), so LoRA adapters
and ``cache_salt`` isolate here too. Since every level of a walk confirms its tokens and its parent's hash, a walk
that matches is the exact chain, whatever the hash function.

Slots are reserved by the engine thread when a store is queued (``reserve``: a free slot, else the least recently
used ready block no load holds) and become visible to lookups only when the copy finished (``finish_store``). A block
that a load holds (``pin``) is never overwritten. The tier is shared by the engine thread and the copy thread:
every method takes the tier's lock. Ids only: the bytes are the offloader's (``offload.py``).
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field

ParentKey = tuple[str, int]     # ("salt", salt) for a chain's first block, else ("hash", parent's hash)


@dataclass
class HostBlock:
    slot: int
    token_ids: tuple[int, ...]
    parent: ParentKey
    ready: bool = False          # its bytes are in the slot (a store in flight is not yet found)
    pins: int = 0                # loads that will read the slot


@dataclass
class HostTierStats:
    queries: int = 0             # lookups (requests admitted with a prompt past their device hit)
    hits: int = 0                # lookups that found at least one block
    hit_tokens: int = 0
    queried_tokens: int = 0
    stored_blocks: int = 0
    dropped_stores: int = 0      # stores cancelled (their device slot was reused first) or that found no slot
    loaded_blocks: int = 0
    read_in_place_blocks: int = 0    # blocks a request's attention read where they lie instead of loading them
    evicted_blocks: int = 0


class HostBlockIndex:
    def __init__(self, num_blocks: int):
        if num_blocks < 1:
            raise ValueError(f"a host KV tier needs at least one block, got {num_blocks}")
        self.num_blocks = num_blocks
        self.blocks: OrderedDict[int, HostBlock] = OrderedDict()   # hash -> block, least recently used first
        self.free_slots = list(range(num_blocks - 1, -1, -1))
        self.lock = threading.Lock()
        self.stats = HostTierStats()

    @property
    def num_ready(self) -> int:
        with self.lock:
            return sum(b.ready for b in self.blocks.values())

    def reserve(self, block_hash: int, token_ids: tuple[int, ...], parent: ParentKey) -> int | None:
        """A slot for a store of this block, or None: already here (or on its way: it is marked recently used), or
        every slot holds a block a load needs or a store is filling."""
        with self.lock:
            held = self.blocks.get(block_hash)
            if held is not None:
                self.blocks.move_to_end(block_hash)
                return None
            slot = self._take_slot()
            if slot is None:
                self.stats.dropped_stores += 1
                return None
            self.blocks[block_hash] = HostBlock(slot, token_ids, parent)
            return slot

    def _take_slot(self) -> int | None:
        if self.free_slots:
            return self.free_slots.pop()
        for block_hash, block in self.blocks.items():   # least recently used first
            if block.ready and not block.pins:
                del self.blocks[block_hash]
                self.stats.evicted_blocks += 1
                return block.slot
        return None

    def finish_store(self, block_hash: int, slot: int, stored: bool) -> None:
        """The copy into ``slot`` finished (``stored``) or was dropped: the block is found from now on, or gone."""
        with self.lock:
            block = self.blocks.get(block_hash)
            assert block is not None and block.slot == slot and not block.ready, (block_hash, slot)
            if stored:
                block.ready = True
                self.stats.stored_blocks += 1
            else:
                del self.blocks[block_hash]
                self.free_slots.append(slot)
                self.stats.dropped_stores += 1

    def lookup_chain(self, hashes_and_chunks: list[tuple[int, tuple[int, ...]]], parent: ParentKey) -> list[HostBlock]:
        """The ready blocks continuing a chain whose last block's key is ``parent``, in order, pinned (``unpin`` them
        once loaded, or dropped); stops at the first miss."""
        found: list[HostBlock] = []
        with self.lock:
            for block_hash, chunk in hashes_and_chunks:
                block = self.blocks.get(block_hash)
                if block is None or not block.ready or block.token_ids != chunk or block.parent != parent:
                    break
                block.pins += 1
                self.blocks.move_to_end(block_hash)
                found.append(block)
                parent = ("hash", block_hash)
        return found

    def pin_ready(self, block_hash: int) -> HostBlock:
        """The ready block of ``block_hash``, pinned (a block just read into the tier from disk)."""
        with self.lock:
            block = self.blocks[block_hash]
            assert block.ready, block
            block.pins += 1
            self.blocks.move_to_end(block_hash)
            return block

    def unpin(self, blocks: list[HostBlock]) -> None:
        with self.lock:
            for block in blocks:
                assert block.pins > 0, block
                block.pins -= 1
