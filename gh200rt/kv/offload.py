"""``KVOffloader``: the bytes of the host KV tier, and the copies between it and the device pool.

Stores run on a copy thread of their own, so a step never waits for one: the engine thread queues a store (a block
and the host slot ``HostBlockIndex.reserve`` gave it) and returns. A device block is never reused while a store reads
it: the pool asks ``claim`` before it hands a free block out, which drops a store that has not started (the block is
then simply not in the host tier) and says no for one that is running (the pool takes another free block, or waits
for the copy when no other is free). On CUDA a store first waits for an event recorded when it was queued, so it
reads what the step that computed the block wrote, and copies on its own stream into pinned memory.

Loads run on the engine thread before the step that reads their blocks (``load``): on the CPU a copy, on CUDA a
copy on the current stream (ordered before the step's kernels, outside any captured graph), whose host blocks stay
held (no store may take them) until an event recorded after it has passed. Blocks that attention reads in place
(``--kv-offloading-reads``, kv/host_blocks.py) stay held while their request runs and are let go the same way
(``release_reads``).

Reads from the disk tier (``--kv-offloading-disk-dir``) run on a reader thread of their own: a lookup that finds
the chain continuing on disk reserves host slots for those blocks, queues their reads and says so
(``HostLookup.reading``); the scheduler lets the request wait, admitting others meanwhile, and finds the blocks in
host memory at a later step. So a step never waits for a disk read either (it used to read the blocks inside the
lookup, holding up every running request's step for the whole prefix).

A copy that fails (out of memory, a dead thread) is logged once; the tier then stores nothing more, and a request
whose blocks are not found recomputes them: nothing is lost or corrupted, only the time the tier would save.

With tensor parallelism (``mirror``) rank 0's offloader decides every store and load for all ranks, and logs the
copies it made (``take_mirror_ops``): each step's message carries the stores finished and the loads made since the
last one, and every worker makes them on its own heads' share of the blocks before it runs the step
(``HostKVMirror``). A store is logged once it has finished, before its device block can be claimed, so a worker's
copy of it always runs before any step that could overwrite that block.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from collections import deque
from dataclasses import dataclass

import numpy as np
import torch

from gh200rt.kv.disk_tier import DiskTier
from gh200rt.kv.host_blocks import device_visible
from gh200rt.kv.host_tier import HostBlock, HostBlockIndex
from gh200rt.kv.layered_load import LayeredLoad

log = logging.getLogger(__name__)

STORE_BATCH = 64       # stores the copy thread takes at once: one gather and one scatter on the CPU


def lower_thread_priority(niceness: int = 10) -> None:
    """Run the calling thread after the engine's: on the CPU platform the copies share the cores a step computes
    on, and a step's parallel regions wait for the slowest thread (Linux: a thread has a nice value of its own)."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), niceness)
    except (AttributeError, OSError):   # not Linux, or not permitted: copies run at the engine's priority
        pass


@dataclass
class HostLookup:
    """What ``KVOffloader.lookup_chain`` found: the ready host blocks continuing a chain (pinned), and whether the
    chain goes on in blocks being read from disk into host slots now (the request had better wait for them)."""
    found: list[HostBlock]
    reading: bool = False


@dataclass
class DiskRead:
    block_hash: int
    slot: int
    block: object                 # the disk tier's DiskBlock


@dataclass
class StoreJob:
    block_id: int
    slot: int
    block_hash: int
    ready: object = None          # torch.cuda.Event recorded when queued (CUDA), else None
    token_ids: tuple[int, ...] = ()   # what the disk tier's file names (its confirmation after a restart)
    parent: tuple[str, int] = ("salt", 0)
    running: bool = False
    cancelled: bool = False


@dataclass(frozen=True)
class HostTierReport:
    """The host KV tier between steps, for /metrics (``EngineStats.kv_host``)."""
    blocks_total: int
    blocks_used: int
    queries: int
    hits: int
    queried_tokens: int
    hit_tokens: int
    stored_blocks: int
    loaded_blocks: int
    dropped_stores: int
    evicted_blocks: int
    stored_bytes: int
    loaded_bytes: int
    load_seconds: float
    disk: object = None           # the disk tier's ``DiskTierStats`` (a copy) and its block count, None without one
    disk_blocks: int = 0
    read_in_place_blocks: int = 0
    disk_reading: int = 0         # blocks being read from disk into host slots now


@dataclass
class OffloadCounters:
    stored_bytes: int = 0
    loaded_bytes: int = 0
    store_seconds: float = 0.0
    load_seconds: float = 0.0     # the engine thread's time in loads (what a step waited for them)


class PoolBlocks:
    """The device pool's blocks as the host tier copies them: block ``b`` is ``[layers, planes, block_size, kv_heads,
    head_dim]``, every layer's K and V (or latent rows). ``block_major``: the device arena's buffer viewed as
    ``[blocks, layers, planes, block_size, kv_heads, head_dim]`` (one block is contiguous there), else the per-layer
    caches are gathered.

    On the CPU a batch of arena blocks moves as rows of bytes through NumPy, on the calling thread alone: torch's
    ops would start parallel regions of their own from the copy thread, on the cores the step computes on. On a GPU
    each block is one contiguous copy to or from pinned memory, on the caller's stream."""

    def __init__(self, kv_caches: list[torch.Tensor], block_major: torch.Tensor | None = None):
        first = kv_caches[0]
        self.caches = kv_caches
        self.block_major = block_major
        self.shape = (len(kv_caches), *first.shape[:1], *first.shape[2:])
        self.dtype = first.dtype
        self.device = first.device
        self.host: torch.Tensor | None = None
        self._rows = None          # (device, host) blocks as rows of bytes (NumPy), for the CPU's copies
        assert block_major is None or tuple(block_major.shape[1:]) == self.shape, (block_major.shape, self.shape)

    @property
    def nbytes_per_block(self) -> int:
        count = 1
        for size in self.shape:
            count *= size
        return count * self.dtype.itemsize

    def bind_host(self, host: torch.Tensor) -> None:
        """The host blocks ``[n, *shape]`` the copies go to and come from."""
        self.host = host
        if self.device.type == "cpu" and self.block_major is not None:
            as_rows = lambda t: t.reshape(t.shape[0], -1).view(torch.uint8).numpy()   # noqa: E731
            self._rows = (as_rows(self.block_major), as_rows(host))

    def read_many(self, block_ids: list[int], slots: list[int], non_blocking: bool = False) -> None:
        """Host block ``slots[i]`` = device block ``block_ids[i]``."""
        host = self.host
        if self._rows is not None:
            device_rows, host_rows = self._rows
            host_rows[slots] = device_rows[block_ids]
        elif self.device.type == "cpu":      # as bytes: torch's index ops on the CPU do not take fp8
            ids = torch.tensor(block_ids)
            gathered = torch.stack([cache.view(torch.uint8).index_select(1, ids) for cache in self.caches])
            host.view(torch.uint8).index_copy_(0, torch.tensor(slots), gathered.permute(2, 0, 1, 3, 4, 5))
        else:
            for block_id, slot in zip(block_ids, slots):
                if self.block_major is not None:
                    host[slot].copy_(self.block_major[block_id], non_blocking=non_blocking)
                else:
                    for layer, cache in enumerate(self.caches):
                        host[slot, layer].copy_(cache[:, block_id], non_blocking=non_blocking)

    def write_many(self, slots: list[int], block_ids: list[int], non_blocking: bool = False) -> None:
        """Device block ``block_ids[i]`` = host block ``slots[i]``."""
        host = self.host
        if self._rows is not None:
            device_rows, host_rows = self._rows
            device_rows[block_ids] = host_rows[slots]
        elif self.device.type == "cpu":
            ids, src = torch.tensor(block_ids), host.view(torch.uint8).index_select(0, torch.tensor(slots))
            for layer, cache in enumerate(self.caches):
                cache.view(torch.uint8).index_copy_(1, ids, src[:, layer].transpose(0, 1))
        else:
            for block_id, slot in zip(block_ids, slots):
                if self.block_major is not None:
                    self.block_major[block_id].copy_(host[slot], non_blocking=non_blocking)
                else:
                    for layer, cache in enumerate(self.caches):
                        cache[:, block_id].copy_(host[slot, layer], non_blocking=non_blocking)

    def write_layer(self, layer: int, slots: list[int], block_ids: list[int],
                    device_tier: torch.Tensor | None = None) -> None:
        """Layer ``layer`` of device block ``block_ids[i]`` = that of host block ``slots[i]`` (kv/layered_load.py).
        On a GPU ``device_tier`` (the host blocks as the device maps them) is required: one kernel gathers the layer's
        rows of every block."""
        host = self.host
        if self._rows is not None:
            device_rows, host_rows = self._rows
            width = device_rows.shape[1] // self.shape[0]        # a block holds its layers one after another
            columns = slice(layer * width, (layer + 1) * width)
            device_rows[block_ids, columns] = host_rows[slots, columns]
        elif self.device.type == "cpu":
            src = host[:, layer].view(torch.uint8).index_select(0, torch.tensor(slots))
            self.caches[layer].view(torch.uint8).index_copy_(1, torch.tensor(block_ids), src.transpose(0, 1))
        else:
            assert device_tier is not None, "a GPU loads a layer by gathering from the mapped tier"
            ids = torch.tensor(block_ids, device=self.device)
            src = device_tier[:, layer].view(torch.uint8).index_select(0, torch.tensor(slots, device=self.device))
            if self.block_major is not None:
                self.block_major[:, layer].view(torch.uint8).index_copy_(0, ids, src)
            else:
                self.caches[layer].view(torch.uint8).index_copy_(1, ids, src.transpose(0, 1))


class HostKVMirror:
    """A tensor-parallel worker's host KV tier: the same host slots as rank 0's, holding this rank's share of each
    block; it copies exactly what rank 0 logged (``KVOffloader.take_mirror_ops``), stores before loads."""

    def __init__(self, blocks: PoolBlocks, num_host_blocks: int, pin_memory: bool = False):
        self.blocks = blocks
        self.host = torch.empty((num_host_blocks, *blocks.shape), dtype=blocks.dtype, pin_memory=pin_memory)
        blocks.bind_host(self.host)

    def apply(self, stores: list[tuple[int, int]], loads: list[tuple[int, int]]) -> None:
        """``stores``: (device block, host slot) pairs; ``loads``: (host slot, device block) pairs."""
        if stores:
            self.blocks.read_many([b for b, _ in stores], [s for _, s in stores])
        if loads:
            self.blocks.write_many([s for s, _ in loads], [b for _, b in loads])


class KVOffloader:
    def __init__(self, blocks: PoolBlocks, num_host_blocks: int, pin_memory: bool = False, mirror: bool = False):
        self.blocks = blocks
        self.device = blocks.device
        self.index = HostBlockIndex(num_host_blocks)
        # pages are touched as blocks are stored (pinned memory is touched when pinned)
        self.host = torch.empty((num_host_blocks, *blocks.shape), dtype=blocks.dtype, pin_memory=pin_memory)
        blocks.bind_host(self.host)
        self.block_bytes = self.host[0].nbytes
        self.counters = OffloadCounters()
        self.failed: str | None = None
        # what a block costs to load and a token to recompute, as measured (a load is worth it where it is cheaper)
        self.load_seconds_per_block = self._time_host_copy()
        self.recompute_seconds_per_token: float | None = None
        self._jobs: dict[int, StoreJob] = {}      # device block id -> its store, queued or running
        self._queue: deque[StoreJob] = deque()
        self._cond = threading.Condition()
        self._closing = False
        self._finishing = 0                       # stores taken by the copy thread and not yet found or dropped
        self._stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        # loads run on a stream of their own, layer by layer where the device maps the tier (kv/layered_load.py)
        self.load_stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        self.device_tier = _mapped(self.host, self.device) if self.device.type == "cuda" else None
        self._loads_in_flight: list[tuple[object, list[HostBlock]]] = []   # (CUDA event, host blocks it reads)
        # tensor parallelism: the copies made since the last step's message, for the workers to repeat
        self.mirror = mirror
        self.disk: DiskTier | None = None         # a third level on local disk (``--kv-offloading-disk-dir``)
        self.disk_read_seconds_per_block: float | None = None
        self._disk_reads: deque[DiskRead] = deque()    # queued for the reader thread
        self._reading: set[int] = set()                # hashes of blocks being read from disk (queued or running)
        self._reader: threading.Thread | None = None   # started by the first read
        self._mirror_stores: list[tuple[int, int]] = []    # (device block, host slot), finished
        self._mirror_loads: list[tuple[int, int]] = []     # (host slot, device block)
        self._thread = threading.Thread(target=self._run, name="gh200rt-kv-store", daemon=True)
        self._thread.start()

    @property
    def nbytes(self) -> int:
        return self.host.nbytes

    def _time_host_copy(self) -> float:
        """A first estimate of one block's load: a copy of a host block, timed (loads as they run refine it). The
        best of three: the first touches fresh pages, and a one-off stall (a busy machine) would otherwise hold every
        hit to cost more than its recompute, so that no load ever ran to correct it."""
        host = self.host.view(torch.uint8)
        scratch = torch.empty_like(host[:1])
        best = float("inf")
        for _ in range(3):
            started = time.perf_counter()
            scratch.index_copy_(0, torch.tensor([0]), host.index_select(0, torch.tensor([0])))
            best = min(best, time.perf_counter() - started)
        return best

    def worth_loading(self, block_size: int) -> bool:
        """Whether a block found in the host tier is loaded rather than recomputed: its load (measured) costs less
        than its ``block_size`` tokens of prompt (measured on the engine's prompt steps; until one is timed, yes).
        Both grow with the blocks, so the answer holds for a hit of any length."""
        per_token = self.recompute_seconds_per_token
        return per_token is None or self.load_seconds_per_block < block_size * per_token

    def observe_prompt_step(self, seconds: float, tokens: int) -> None:
        """A step that computed ``tokens`` prompt tokens (and nothing else) took ``seconds``."""
        if tokens > 0:
            rate = seconds / tokens
            old = self.recompute_seconds_per_token
            self.recompute_seconds_per_token = rate if old is None else 0.8 * old + 0.2 * rate

    def report(self) -> HostTierReport:
        s, c = self.index.stats, self.counters
        disk = dataclasses.replace(self.disk.stats) if self.disk is not None else None
        return HostTierReport(self.index.num_blocks, self.index.num_ready, s.queries, s.hits, s.queried_tokens,
                              s.hit_tokens, s.stored_blocks, s.loaded_blocks, s.dropped_stores, s.evicted_blocks,
                              c.stored_bytes, c.loaded_bytes, c.load_seconds, disk,
                              len(self.disk.blocks) if self.disk is not None else 0, s.read_in_place_blocks,
                              len(self._reading))

    # ---- stores ---------------------------------------------------------------------------------
    def store(self, block_id: int, block_hash: int, token_ids: tuple[int, ...], parent) -> None:
        """Queue a copy of device block ``block_id`` (published as ``block_hash``) into the host tier."""
        if self.failed is not None:
            return
        slot = self.index.reserve(block_hash, token_ids, parent)
        if slot is None:
            return
        ready = None
        if self._stream is not None:
            ready = torch.cuda.Event()
            ready.record(torch.cuda.current_stream(self.device))
        job = StoreJob(block_id, slot, block_hash, ready, token_ids, parent)
        with self._cond:
            previous = self._jobs.get(block_id)
            assert previous is None or previous.running, previous   # a queued store is claimed before reuse
            self._jobs[block_id] = job
            self._queue.append(job)
            self._cond.notify_all()

    def claim(self, block_id: int, wait: bool = False) -> bool:
        """May device block ``block_id`` be overwritten now? A queued store of it is dropped; a running one makes
        the answer no (``wait``: wait for it instead)."""
        with self._cond:
            job = self._jobs.get(block_id)
            if job is None:
                return True
            if not job.running:
                job.cancelled = True
                del self._jobs[block_id]
            elif not wait:
                return False
            else:
                self._cond.wait_for(lambda: self._jobs.get(block_id) is not job)
                return True
        self.index.finish_store(job.block_hash, job.slot, stored=False)
        return True

    def _start_worker(self) -> None:
        """What each of the tier's threads does first: on the CPU, run after the engine's threads."""
        if self._stream is None:
            lower_thread_priority()

    def _has_work(self, queue: deque) -> bool:
        """Under ``_cond``: wait until ``queue`` holds a job (True), or the tier closes with none left (False)."""
        self._cond.wait_for(lambda: queue or self._closing)
        return bool(queue)

    def _run(self) -> None:
        self._start_worker()
        while True:
            with self._cond:
                if not self._has_work(self._queue):
                    return
                batch = []
                while self._queue and len(batch) < STORE_BATCH:
                    job = self._queue.popleft()
                    if not job.cancelled:
                        job.running = True
                        batch.append(job)
                self._finishing += len(batch)
            if not batch:
                continue
            stored = self._copy_out(batch)
            with self._cond:
                if stored and self.mirror:    # logged before the blocks can be claimed (see the module's docstring)
                    self._mirror_stores.extend((job.block_id, job.slot) for job in batch)
                for job in batch:
                    if self._jobs.get(job.block_id) is job:
                        del self._jobs[job.block_id]
                self._cond.notify_all()
            if stored and self.disk is not None:    # before the blocks are ready: no lookup can take their slots yet
                for job in batch:
                    self.disk.write(job.block_hash, job.token_ids, job.parent, self._slot_bytes(job.slot))
            for job in batch:
                self.index.finish_store(job.block_hash, job.slot, stored)
            with self._cond:
                self._finishing -= len(batch)
                self._cond.notify_all()

    def _copy_out(self, batch: list[StoreJob]) -> bool:
        if self.failed is not None:
            return False
        started = time.perf_counter()
        ids, slots = [job.block_id for job in batch], [job.slot for job in batch]
        try:
            if self._stream is None:
                self.blocks.read_many(ids, slots)
            else:
                with torch.cuda.stream(self._stream):
                    self._stream.wait_event(batch[-1].ready)    # recorded last: the steps before it are done too
                    self.blocks.read_many(ids, slots, non_blocking=True)
                self._stream.synchronize()
        except Exception as err:     # noqa: BLE001 - any failure degrades the tier to recompute, never the step
            self.failed = f"{type(err).__name__}: {err}"
            log.warning("the host KV tier stops storing blocks (requests recompute what it would hold): a copy to "
                        "host memory failed: %s", self.failed)
            return False
        self.counters.store_seconds += time.perf_counter() - started
        self.counters.stored_bytes += len(batch) * self.block_bytes
        return True

    def take_mirror_ops(self) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        """The stores finished and the loads made since the last call (tensor parallelism: sent with each step)."""
        with self._cond:
            stores, self._mirror_stores = self._mirror_stores, []
        loads, self._mirror_loads = self._mirror_loads, []
        return stores, loads

    def wait_for_stores(self) -> None:
        """Until every queued store has run (tests, shutdown)."""
        with self._cond:
            self._cond.wait_for(lambda: not self._queue and not self._jobs and not self._finishing)

    def close(self) -> None:
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._thread.join(timeout=10)
        if self._reader is not None:
            self._reader.join(timeout=10)

    def _slot_bytes(self, slot: int) -> np.ndarray:
        return self.host[slot].view(torch.uint8).reshape(-1).numpy()

    # ---- lookups --------------------------------------------------------------------------------
    def lookup_chain(self, chain: list[tuple[int, tuple[int, ...]]], parent, block_size: int) -> HostLookup:
        """The blocks continuing a chain (``HostBlockIndex.lookup_chain``), pinned. Past the host tier's, where the
        chain goes on on disk and reading a block costs less than recomputing it, the reads of those blocks into host
        slots are queued (or already running): ``reading``, and a later lookup finds them in host memory."""
        self._release_finished_loads()
        if self.disk is None:
            return HostLookup(self.index.lookup_chain(chain, parent))
        # the walk and the reading check under one hold of ``_cond``: a read makes its block ready and only then
        # leaves ``_reading`` (under ``_cond``), so a block the walk missed is still there if it is being read; a
        # read finishing between the two would otherwise look like neither, and its request recompute the block
        with self._cond:
            found = self.index.lookup_chain(chain, parent)
            if len(found) == len(chain):
                return HostLookup(found)
            rest = chain[len(found):]
            if rest[0][0] in self._reading:
                return HostLookup(found, reading=True)
        if not self._worth_reading(block_size):
            return HostLookup(found)
        parent = ("hash", chain[len(found) - 1][0]) if found else parent
        reads = []
        for block_hash, chunk in rest:
            on_disk = self.disk.lookup(block_hash, chunk, parent)
            if on_disk is None:
                break
            slot = self.index.reserve(block_hash, chunk, parent)
            if slot is None:       # on its way into the host tier already, or no slot free of loads and stores
                break
            reads.append(DiskRead(block_hash, slot, on_disk))
            parent = ("hash", block_hash)
        if not reads:
            return HostLookup(found)
        self.disk.stats.hits += 1
        with self._cond:
            self._reading.update(r.block_hash for r in reads)
            self._disk_reads.extend(reads)
            if self._reader is None:
                self._reader = threading.Thread(target=self._read_from_disk, name="gh200rt-kv-disk-read",
                                                daemon=True)
                self._reader.start()
            self._cond.notify_all()
        return HostLookup(found, reading=True)

    @property
    def reading_from_disk(self) -> bool:
        with self._cond:
            return bool(self._reading)

    def wait_for_disk_reads(self, timeout: float | None = None) -> bool:
        """Until no block is being read from disk (or ``timeout`` seconds); whether none is."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._reading, timeout)

    def _read_from_disk(self) -> None:
        """The reader thread: each queued block's file into its host slot, which lookups then find (or, where the
        file is gone or damaged, the slot freed and the file forgotten: its tokens are recomputed)."""
        self._start_worker()
        while True:
            with self._cond:
                if not self._has_work(self._disk_reads):
                    return
                job = self._disk_reads.popleft()
            started = time.perf_counter()
            ok = self.disk.read_into(job.block, self._slot_bytes(job.slot))
            seconds = time.perf_counter() - started
            if ok:
                old = self.disk_read_seconds_per_block
                self.disk_read_seconds_per_block = seconds if old is None else 0.8 * old + 0.2 * seconds
                self.disk.stats.hit_blocks += 1
            else:
                self.disk.forget(job.block_hash)
            self.index.finish_store(job.block_hash, job.slot, ok)
            with self._cond:
                self._reading.discard(job.block_hash)
                self._cond.notify_all()

    def _worth_reading(self, block_size: int) -> bool:
        """Whether a block on disk is read rather than recomputed: a read and a load against the block's tokens of
        prompt, both measured (until either is, yes)."""
        per_token, read = self.recompute_seconds_per_token, self.disk_read_seconds_per_block
        return per_token is None or read is None or read + self.load_seconds_per_block < block_size * per_token

    # ---- loads and reads in place ------------------------------------------------------------------
    def _release_finished_loads(self) -> None:
        """Let go of the host blocks of asynchronous loads and reads in place (CUDA) that have run."""
        while self._loads_in_flight and self._loads_in_flight[0][0].query():
            self.index.unpin(self._loads_in_flight.pop(0)[1])

    def release_reads(self, blocks: list[HostBlock]) -> None:
        """Let go of host blocks a request's attention read in place (it finished or was preempted): on the CPU at
        once; on CUDA once the steps queued so far have run (one may still read them), as loads are let go."""
        if self._stream is None:
            self.index.unpin(blocks)
            return
        done = torch.cuda.Event()
        done.record(torch.cuda.current_stream(self.device))
        self._loads_in_flight.append((done, list(blocks)))
        self._release_finished_loads()

    def load(self, pairs: list[tuple[HostBlock, int]]) -> None:
        """Copy each host block into its device block, every layer at once (before the step that reads them), and let
        go of them."""
        if not pairs:
            return
        self._release_finished_loads()
        started = time.perf_counter()
        held = [block for block, _ in pairs]
        try:
            self.blocks.write_many([block.slot for block, _ in pairs], [block_id for _, block_id in pairs],
                                   non_blocking=self._stream is not None)
        except BaseException:
            self.index.unpin(held)
            raise
        self._log_mirror_loads(pairs)
        done = None
        if self._stream is not None:    # the copies are queued on the stream: their host blocks stay held until run
            done = torch.cuda.Event()
            done.record(torch.cuda.current_stream(self.device))
        self.loaded(held, time.perf_counter() - started, done)

    def start_layered_load(self, pairs: list[tuple[HostBlock, int]]) -> LayeredLoad:
        """The loads of ``pairs`` layer by layer, for the step about to run (kv/layered_load.py)."""
        self._release_finished_loads()
        try:
            loads = LayeredLoad(self, pairs, self.blocks.shape[0])
        except BaseException:
            self.index.unpin([block for block, _ in pairs])
            raise
        self._log_mirror_loads(pairs)
        return loads

    def _log_mirror_loads(self, pairs: list[tuple[HostBlock, int]]) -> None:
        if self.mirror:
            self._mirror_loads.extend((block.slot, block_id) for block, block_id in pairs)

    def loaded(self, held: list[HostBlock], seconds: float, done=None) -> None:
        """Count a load of ``held`` that took ``seconds`` to make or queue, and let go of its host blocks: now, or
        once ``done`` (a CUDA event after its copies) has run."""
        if done is None:
            self.index.unpin(held)
        else:
            self._loads_in_flight.append((done, held))
        self.counters.load_seconds += seconds
        self.counters.loaded_bytes += len(held) * self.block_bytes
        self.load_seconds_per_block = 0.8 * self.load_seconds_per_block + 0.2 * seconds / len(held)
        self.index.stats.loaded_blocks += len(held)


def _mapped(host: torch.Tensor, device: torch.device) -> torch.Tensor | None:
    """The pinned tier as ``device`` maps it (one gather per layer reads it), or None where it is not mapped."""
    try:
        return device_visible(host, device)
    except (ImportError, RuntimeError, AssertionError) as err:
        log.info("host KV tier: loads copy block by block (%s)", err)
        return None
