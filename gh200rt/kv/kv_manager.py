"""Per-request block tables on top of the ``BlockPool``, with prefix caching.

Contract: a request's ``block_ids`` always cover its ``num_computed_tokens`` plus the tokens
scheduled this step. Full blocks of computed tokens are published under a chained hash
(``hash(parent_hash, token_ids)``); a lookup walks the chain and confirms every hit against
the stored tokens and the exact parent block, so a hash collision can only cost a miss.
A lookup never covers the whole prompt: the last prompt token is always computed, because its
logits produce the first output token. A request's ``cache_salt`` (``salt_of``: its LoRA adapter's id, 0 for the
base model, mixed with vLLM's per-request ``cache_salt`` string when one is sent) roots its chain: blocks computed
under one adapter or salt are never found by another. Without ``publish_decoded_blocks`` only blocks of prompt
positions are published: on the CPU a decode step computes with other kernels than a prefill
(engine/invariance.py), and a cached block must hold what a prefill of its tokens computes.

With a host KV tier (``offload``: kv/offload.py) published blocks are also copied to host memory, as they are
published (write-through) or when their last reference goes (write-back), and a lookup that ends in the device pool
continues there (``find_host_prefix``): the blocks it finds get device blocks like computed ones
(``adopt_host_prefix``, then ``start_host_loads`` once the request's blocks are allocated), and are copied in by
the step that reads them, each layer's before that layer runs (``take_host_loads``). They hold the bytes the device
pool held, so a request computes the same bits whichever tier its prefix came from. Or they are read in place
(``host_reads``: ``in_place``, or ``auto`` per request): the request's table names them by ids from the device pool's
block count on (kv/host_blocks.py), they take no device block and no copy, and stay pinned in the host tier until the
request lets go of its blocks.
"""
from __future__ import annotations

import hashlib
from array import array
from dataclasses import dataclass
from typing import Callable, Protocol

from gh200rt.kv.block_pool import BlockPool
from gh200rt.kv.layered_load import LayeredLoad

HashFn = Callable[[int | None, tuple[int, ...]], int]


def chain_hash(parent_hash: int | None, token_ids: tuple[int, ...]) -> int:
    return hash((parent_hash, token_ids))


def sha256_chain_hash(parent_hash: int | None, token_ids: tuple[int, ...]) -> int:
    """``chain_hash`` by sha256 (``--prefix-caching-hash-algo sha256``): the same in every process and after a
    restart, so blocks can be found by another process (64 bits of the digest)."""
    digest = hashlib.sha256(b"\0" if parent_hash is None else b"\1" + parent_hash.to_bytes(8, "little"))
    digest.update(array("q", token_ids).tobytes())
    return int.from_bytes(digest.digest()[:8], "little")


HASH_FNS: dict[str, HashFn] = {"builtin": chain_hash, "sha256": sha256_chain_hash}


def chain_root(salt: int, hash_fn: HashFn = chain_hash) -> tuple[int | None, tuple[int, int] | None]:
    """(parent hash, parent identity) of a chain's first block: none for salt 0, else a root no block id has, so
    a lookup confirms the salt exactly, as it confirms tokens and parents (a token id is never negative, so the
    root's hash is no block's)."""
    return (None, None) if not salt else (hash_fn(None, (-1, salt >> 32, salt & 0xFFFFFFFF)), (-1, salt))


def host_parent(parent_hash: int | None, parent: tuple[int, int] | None) -> tuple[str, int]:
    """The host tier's key for a block's parent (``host_tier.ParentKey``) from the device pool's: the chain's salt
    for a first block, else the parent block's hash (the host tier has no device identities)."""
    if parent is None:
        return ("salt", 0)
    if parent[0] == -1:
        return ("salt", parent[1])
    return ("hash", parent_hash)


def salt_of(adapter_id: int, salt: str | None) -> int:
    """A request's chain salt: its LoRA adapter's id, or with a salt string a 64-bit digest of both whose top bit
    is set, so it is never an adapter's id (two different salts meet with odds of 2**-63)."""
    if salt is None:
        return adapter_id
    digest = hashlib.sha256(f"{adapter_id}\0{salt}".encode()).digest()
    return int.from_bytes(digest[:8], "big") | 1 << 63


HOST_READS = ("load", "in_place", "auto")


class HasBlocks(Protocol):
    block_ids: list[int]
    host_blocks: list              # host-tier blocks adopted and not yet given device blocks (pinned there)
    host_reads: list               # host-tier blocks its table names, read in place (pinned there)
    block_hashes: list[int]        # chained hashes of the request's published full blocks
    num_computed_tokens: int
    prompt_token_ids: list[int]    # read only when decoded blocks are not published
    cache_salt: int                # 0, or what else the KV depends on besides the tokens (``salt_of``)

    @property
    def all_token_ids(self) -> list[int]: ...


@dataclass
class PrefixCacheStats:
    lookups: int = 0
    hits: int = 0                  # lookups that reused at least one block
    hit_tokens: int = 0
    queried_tokens: int = 0


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True,
                 hash_fn: HashFn = chain_hash, pool: BlockPool | None = None,
                 publish_decoded_blocks: bool = True):
        """``pool``: the device arena's pool (some of its blocks may hold weights); else a pool of ``num_blocks``.
        ``publish_decoded_blocks``: publish full blocks that hold generated tokens too (else prompt blocks only)."""
        self.pool = pool if pool is not None else BlockPool(num_blocks)
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.publish_decoded_blocks = publish_decoded_blocks
        self.hash_fn = hash_fn
        self.stats = PrefixCacheStats()
        self.offload = None               # the host KV tier's offloader (attach_host_tier)
        self._write_through = True
        self._pending_loads: list = []     # (host block, device block id) to copy before the next step
        self.host_reads = "load"

    def attach_host_tier(self, offload, write_policy: str = "write_through", reads: str = "load") -> None:
        """Keep published blocks in ``offload``'s host tier too (``write_through``: as they are published;
        ``write_back``: when their last reference goes) and look there after the device pool; ``reads``: how a
        prefix found there is read (``HOST_READS``: loaded, read in place, or chosen per request)."""
        assert reads in HOST_READS, reads
        self.offload = offload
        self.host_reads = reads
        self._write_through = write_policy == "write_through"
        self.pool.reuse_guard = offload.claim
        if not self._write_through:
            self.pool.on_free_cached = self._store_block

    def _store_block(self, block) -> None:
        self.offload.store(block.block_id, block.block_hash, block.token_ids,
                           host_parent(block.parent_hash, block.parent))

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def find_cached_prefix(self, token_ids: list[int], salt: int = 0) -> tuple[list[int], list[int]]:
        """(block ids, their hashes) of the longest cached prefix computed under ``salt``, leaving >= 1 token to
        compute."""
        if not self.enable_prefix_caching:
            return [], []
        self.stats.lookups += 1
        self.stats.queried_tokens += len(token_ids)
        bs = self.block_size
        hits: list[int] = []
        hashes: list[int] = []
        parent_hash, parent = chain_root(salt, self.hash_fn)
        for start in self._reusable_block_starts(len(token_ids)):
            chunk = tuple(token_ids[start:start + bs])
            h = self.hash_fn(parent_hash, chunk)
            block_id = self.pool.lookup(h, chunk, parent)
            if block_id is None:
                break
            hits.append(block_id)
            hashes.append(h)
            parent_hash, parent = h, self.pool.identity(block_id)
        if hits:
            self.stats.hits += 1
            self.stats.hit_tokens += len(hits) * bs
        return hits, hashes

    def _reusable_block_starts(self, num_tokens: int) -> range:
        """First token of each full block a prefix hit may cover (at least one token is left to compute)."""
        bs = self.block_size
        return range(0, num_tokens - 1 - (num_tokens - 1) % bs, bs)

    def prefix_hashes(self, token_ids: list[int], salt: int = 0) -> list[int]:
        """The chained hashes of the blocks a prefix hit may cover (``find_cached_prefix``'s keys)."""
        hashes, parent_hash = [], chain_root(salt, self.hash_fn)[0]
        for start in self._reusable_block_starts(len(token_ids)):
            parent_hash = self.hash_fn(parent_hash, tuple(token_ids[start:start + self.block_size]))
            hashes.append(parent_hash)
        return hashes

    def blocks_to_admit(self, num_tokens: int, hashes: list[int]) -> int:
        """Free blocks a waiting request of ``num_tokens`` takes when admitted: its blocks less the leading
        cached ones that running requests hold (shared at no cost; a free cached block is revived out of
        the free list, so it counts). ``hashes``: ``prefix_hashes`` of its tokens. An estimate for the tier
        controller: hashes are not confirmed against the stored tokens, as admission does."""
        need = self.blocks_needed(num_tokens)
        if not self.enable_prefix_caching:
            return need
        for h in hashes:
            block_id = self.pool.cached.get(h)
            if block_id is None:
                break
            need -= self.pool.blocks[block_id].ref_count > 0
        return need

    # ``request.block_ids`` only grows (``extend``) or is replaced by a new list, never edited in place:
    # kv/block_row.py keeps its int32 copy in step by that rule

    def adopt_prefix(self, request: HasBlocks, block_ids: list[int], hashes: list[int]) -> None:
        """Give a fresh request shared references to already-computed blocks (prefix hit or fork)."""
        assert not request.block_ids and request.num_computed_tokens == 0
        for block_id in block_ids:
            self.pool.touch(block_id)
        request.block_ids = list(block_ids)
        request.block_hashes = list(hashes)
        request.num_computed_tokens = len(block_ids) * self.block_size

    def can_allocate(self, request: HasBlocks, num_new_tokens: int) -> bool:
        need = self.blocks_needed(request.num_computed_tokens + num_new_tokens) - len(request.block_ids)
        return need <= self.pool.num_free

    def allocate(self, request: HasBlocks, num_new_tokens: int) -> bool:
        """Extend the table to cover the scheduled tokens; False (nothing taken) if the pool is short."""
        need = self.blocks_needed(request.num_computed_tokens + num_new_tokens) - len(request.block_ids)
        if need > self.pool.num_free:
            return False
        if need > 0:
            request.block_ids.extend(self.pool.allocate(need))
        return True

    def publish_full_blocks(self, request: HasBlocks) -> None:
        """After a step: hash and publish the request's newly completed full blocks."""
        if not self.enable_prefix_caching:
            return
        bs = self.block_size
        tokens = request.all_token_ids
        # a step launched ahead computes a position whose token only the device holds yet: publish what is known
        num_full = min(request.num_computed_tokens, len(tokens)) // bs
        if not self.publish_decoded_blocks:
            num_full = min(num_full, len(request.prompt_token_ids) // bs)
        while len(request.block_hashes) < num_full:
            i = len(request.block_hashes)
            parent_hash, parent = self._parent_of(request, i)
            chunk = tuple(tokens[i * bs:(i + 1) * bs])
            h = self.hash_fn(parent_hash, chunk)
            published = self.pool.register(request.block_ids[i], h, chunk, parent, parent_hash)
            if published and self.offload is not None and self._write_through:
                self.offload.store(request.block_ids[i], h, chunk, host_parent(parent_hash, parent))
            request.block_hashes.append(h)

    def _parent_of(self, request: HasBlocks, i: int) -> tuple[int | None, tuple[int, int] | None]:
        """(hash, device identity) of the block before block ``i`` of ``request``'s chain. A host block read in place
        has no device identity: (-2, its hash) is no device block's, so a device lookup never continues past it (the
        host tier's walk, which confirms parents by hash, does)."""
        if i:
            parent_id, parent_hash = request.block_ids[i - 1], request.block_hashes[i - 1]
            if parent_id >= self.pool.num_blocks:
                return parent_hash, (-2, parent_hash)
            return parent_hash, self.pool.identity(parent_id)
        return chain_root(getattr(request, "cache_salt", 0), self.hash_fn)

    def is_device_prefix(self, block_ids: list[int]) -> bool:
        """Whether every one of ``block_ids`` is a device block (none is a host block read in place)."""
        return all(block_id < self.pool.num_blocks for block_id in block_ids)

    # ---- the host tier ---------------------------------------------------------------------------
    def find_host_prefix(self, request: HasBlocks, hashes: list[int]) -> list | None:
        """The host tier's blocks that continue ``request``'s prefix past the device pool's ``hashes`` (its hit),
        pinned there; none when a load would cost more than the recompute (``KVOffloader.worth_loading``); None
        while more of it is being read from disk into host memory (the request waits for it, holding nothing)."""
        if self.offload is None or not self.enable_prefix_caching:
            return []
        tokens, bs = request.all_token_ids, self.block_size
        starts = self._reusable_block_starts(len(tokens))[len(hashes):]
        if not starts:
            return []
        salt = getattr(request, "cache_salt", 0)
        parent_hash = hashes[-1] if hashes else chain_root(salt, self.hash_fn)[0]
        parent = ("hash", parent_hash) if hashes else ("salt", salt)
        chain = []
        for start in starts:
            chunk = tuple(tokens[start:start + bs])
            parent_hash = self.hash_fn(parent_hash, chunk)
            chain.append((parent_hash, chunk))
        stats = self.offload.index.stats
        stats.queries += 1
        stats.queried_tokens += len(chain) * bs
        lookup = self.offload.lookup_chain(chain, parent, bs)
        found = lookup.found
        if lookup.reading:
            self.offload.index.unpin(found)
            return None
        if found and self.host_reads != "in_place" and not self.offload.worth_loading(bs):   # in place: no copy
            self.offload.index.unpin(found)
            return []
        if found:
            stats.hits += 1
            stats.hit_tokens += len(found) * bs
        return [(block, h) for block, (h, _) in zip(found, chain)]

    def adopt_host_prefix(self, request: HasBlocks, found: list, prompt_only: bool = False) -> None:
        """Count ``find_host_prefix``'s blocks as computed. Loaded: ``allocate`` gives them device blocks, and
        ``start_host_loads`` (after it) schedules their copies, or ``free`` lets go of them. Read in place
        (``reads_in_place``): the table names them as they are, and ``free`` lets go of them.
        ``prompt_only``: the request computes its prompt and at most one token (``auto`` reads such a hit in place:
        its bytes cross the link once either way)."""
        if self.reads_in_place(request, prompt_only):
            first = self.pool.num_blocks
            request.block_ids.extend(first + block.slot for block, _ in found)
            request.block_hashes.extend(h for _, h in found)
            request.host_reads = [block for block, _ in found]
            self.offload.index.stats.read_in_place_blocks += len(found)
        else:
            request.host_blocks = list(found)
        request.num_computed_tokens += len(found) * self.block_size

    def reads_in_place(self, request: HasBlocks, prompt_only: bool = False) -> bool:
        """Whether a host-tier hit that continues ``request``'s device hit (``block_ids``) is read in place.
        ``auto``: where loading it would not fit in the free device blocks now, beside the rest of the prompt (the
        request would wait, or another be preempted), or for a request that reads it once (``prompt_only``);
        otherwise it is loaded: every later step then reads it from device memory, not over the link."""
        if self.host_reads != "auto":
            return self.host_reads == "in_place"
        if prompt_only:
            return True
        loaded_need = self.blocks_needed(len(request.all_token_ids)) - len(request.block_ids)
        return loaded_need > self.pool.num_free

    def start_host_loads(self, request: HasBlocks) -> None:
        """Publish the device blocks ``allocate`` gave a request's host-tier blocks, and queue their loads."""
        found = getattr(request, "host_blocks", None)
        if not found:
            return
        first = len(request.block_hashes)
        for j, (block, h) in enumerate(found):
            i = first + j
            parent_hash, parent = self._parent_of(request, i)
            self.pool.register(request.block_ids[i], h, block.token_ids, parent, parent_hash)
            request.block_hashes.append(h)
            self._pending_loads.append((block, request.block_ids[i]))
        request.host_blocks = []

    def run_host_loads(self) -> None:
        """Copy the queued host-tier blocks into their device blocks, every layer at once."""
        if self._pending_loads:
            pending, self._pending_loads = self._pending_loads, []
            self.offload.load(pending)

    def take_host_loads(self) -> LayeredLoad | None:
        """The queued host-tier blocks' loads for the step about to run, made layer by layer as its layers run
        (kv/layered_load.py); None where there are none."""
        if not self._pending_loads:
            return None
        pending, self._pending_loads = self._pending_loads, []
        return self.offload.start_layered_load(pending)

    def tokens_shared_on_device(self, request: HasBlocks) -> int:
        """Of ``request``'s computed tokens, those in its leading blocks another request also holds: they stay in
        the device pool when it is freed, and a later lookup finds them there (a preemption loses none of them)."""
        shared = 0
        for block_id in request.block_ids:
            if block_id >= self.pool.num_blocks or self.pool.blocks[block_id].ref_count < 2:
                break
            shared += 1
        return min(shared * self.block_size, request.num_computed_tokens)

    def tokens_kept_after_free(self, request: HasBlocks) -> int:
        """Of ``request``'s computed tokens, those a later lookup finds in the host tier once its blocks are freed
        (its published full blocks: stored as published, or as they are freed with write-back); 0 without the
        tier. What a preemption of it costs in loads rather than in recompute."""
        if self.offload is None:
            return 0
        return min(len(request.block_hashes) * self.block_size, request.num_computed_tokens)

    def free(self, request: HasBlocks) -> None:
        found = getattr(request, "host_blocks", None)
        if found:                                   # adopted, never given device blocks: let go of them
            self.offload.index.unpin([block for block, _ in found])
            request.host_blocks = []
        reads = getattr(request, "host_reads", None)
        if reads:
            self.offload.release_reads(reads)
            request.host_reads = []
        first_host = self.pool.num_blocks
        self.pool.release([block_id for block_id in reversed(request.block_ids) if block_id < first_host])
        request.block_ids = []
        request.block_hashes = []
