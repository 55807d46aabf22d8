"""The host KV tier's size and its offloader, made once at start-up (``--kv-offloading-size``).

The tier takes host memory beside the host weights, which are placed by then: what the process can still get is what
the kernel reports available (the GPU's NUMA node on a GPU host, the whole machine on the CPU platform), less a
margin for the process's own growth (activations, a server's buffers). ``auto`` takes half of what is left after
the margin; a size asked for beyond it is refused with the size that fits. On a GPU host the tier is pinned (the
copies run asynchronously); on the CPU platform it is plain memory, touched only as blocks are stored.

With tensor parallelism the size is the tiers of all ranks together, as vLLM reads it: each rank keeps its heads'
share of every block in the same slots (a worker's ``HostKVMirror``), so a slot costs every rank's share.
"""
from __future__ import annotations

import logging
import re
from pathlib import Path

import torch

from gh200rt.config import CacheConfig, EngineConfig
from gh200rt.kv.disk_tier import DiskTier, disk_capacity_bytes
from gh200rt.kv.offload import KVOffloader, PoolBlocks
from gh200rt.weights.slabs import node_available_bytes

log = logging.getLogger(__name__)

MARGIN_BYTES = 2 << 30        # host memory left to the process itself
READS_SAID = {"load": "loaded into device blocks", "in_place": "read in place by attention",
              "auto": "read in place where the device pool is short or the request reads its prompt once, else loaded"}
AUTO_SHARE = 0.5              # of what is left after the margin, what ``auto`` takes


def host_available_bytes(numa_node: int | None, meminfo: str = "/proc/meminfo") -> int | None:
    """Memory the process can still get: ``numa_node``'s (a GPU host: the node nearest the GPU), else the machine's
    ``MemAvailable``; None when unknown."""
    if numa_node is not None:
        found = node_available_bytes(numa_node)
        if found is not None:
            return found
    try:
        text = Path(meminfo).read_text()
    except OSError:
        return None
    match = re.search(r"^MemAvailable:\s+(\d+) kB", text, re.M)
    return int(match.group(1)) * 1024 if match else None


def host_tier_blocks(cache: CacheConfig, block_bytes: int, available: int | None) -> int:
    """Blocks of ``block_bytes`` the host tier gets (0: off); refuses a size that does not fit, naming one that does.
    ``available``: host memory the process can still get, the host weights already taken from it."""
    if cache.kv_offloading_size is None:
        return 0
    room = None if available is None else max(0, available - MARGIN_BYTES)
    if cache.kv_offloading_auto:
        if room is None:
            raise ValueError("--kv-offloading-size auto: this system does not say how much host memory is "
                             "available; give a size (e.g. --kv-offloading-size 4)")
        nbytes = int(room * AUTO_SHARE)
    else:
        nbytes = cache.kv_offloading_bytes
        if room is not None and nbytes > room:
            raise ValueError(f"--kv-offloading-size {cache.kv_offloading_size}: the host KV tier would take "
                             f"{nbytes / 2**30:.2f} GiB, but host memory has {available / 2**30:.2f} GiB available "
                             f"after the model's host weights, of which {MARGIN_BYTES / 2**30:.0f} GiB stay with the "
                             f"process; give at most {room / 2**30:.2f} GiB (--kv-offloading-size "
                             f"{room / 2**30:.2f}) or auto")
    blocks = nbytes // block_bytes
    if blocks < 1:
        raise ValueError(f"--kv-offloading-size {cache.kv_offloading_size}: {nbytes} bytes hold no KV block of "
                         f"{block_bytes} bytes (every layer's K and V for --block-size {cache.block_size} tokens); "
                         f"give at least {block_bytes / 2**20:.2f} MiB")
    return blocks


def make_host_tier(config: EngineConfig, kv_caches: list[torch.Tensor], device: str,
                   numa_node: int | None = None, block_major: torch.Tensor | None = None) -> KVOffloader | None:
    """The host tier's offloader for these device KV caches (``block_major``: the device arena's blocks, where the
    caches are views of it), or None with the tier off; with tensor parallelism rank 0's, which logs its copies for
    the workers."""
    if config.cache.kv_offloading_size is None:
        return None
    ranks = config.parallel.tensor_parallel_size
    blocks = PoolBlocks(kv_caches, block_major)
    on_gpu = torch.device(device).type == "cuda"
    block_bytes = blocks.nbytes_per_block
    num = host_tier_blocks(config.cache, block_bytes * ranks, host_available_bytes(numa_node if on_gpu else None))
    offload = KVOffloader(blocks, num, pin_memory=on_gpu, mirror=ranks > 1)
    share = f" on each of {ranks} ranks" if ranks > 1 else ""
    log.info("host KV tier: %d blocks of %d tokens (%.2f GiB of host memory%s%s), %s", num, config.cache.block_size,
             offload.nbytes / 2**30, share, ", pinned" if on_gpu else "", config.cache.kv_offloading_write_policy)
    if config.cache.kv_offloading_disk_dir is not None:
        offload.disk = make_disk_tier(config, blocks)
    return offload


def in_place_unavailable(config: EngineConfig, kv_caches: list[torch.Tensor], device: str) -> str | None:
    """Why this engine's attention cannot read host KV blocks in place (None: it can)."""
    drafted = config.speculative.method
    if drafted is not None and drafted.method == "draft_model":
        return "the draft model computes its KV over every prompt position, and keeps none for blocks read in place"
    return None


def host_reads(config: EngineConfig, kv_caches: list[torch.Tensor], device: str) -> str:
    """How host-tier hits are read (``kv_manager.HOST_READS``): what ``--kv-offloading-reads`` asks where this
    engine can read in place; ``auto`` loads where it cannot, and ``in_place`` is refused with the reason. On the
    CPU platform ``auto`` reads every hit in place: the device pool is host memory too, so a load would only copy
    the bytes (and take pool blocks) for attention to read them at the same speed."""
    asked = config.cache.kv_offloading_reads
    why_not = None if asked == "load" else in_place_unavailable(config, kv_caches, device)
    if why_not is not None and asked == "in_place":
        raise ValueError(f"--kv-offloading-reads in_place: {why_not}; or use --kv-offloading-reads load")
    reads = asked if why_not is None else "load"
    why = f" (auto: {why_not})" if why_not is not None and asked == "auto" else ""
    if reads == "auto" and torch.device(device).type == "cpu":
        reads, why = "in_place", " (auto on the CPU: the device pool is host memory too, a load would only copy)"
    log.info("host KV tier hits: %s%s", READS_SAID[reads], why)
    return reads


def make_disk_tier(config: EngineConfig, blocks: PoolBlocks) -> DiskTier:
    """The disk tier under the host tier, refusing a directory that holds blocks of another model or layout."""
    cache = config.cache
    identity = {"format": 1, "model": str(Path(config.model.model).resolve()) if Path(config.model.model).exists()
                else config.model.model, "kv_dtype": str(blocks.dtype), "block_shape": list(blocks.shape),
                "block_size": cache.block_size, "hash": cache.prefix_caching_hash_algo}
    capacity = disk_capacity_bytes(cache.kv_offloading_disk_dir, cache.kv_offloading_disk_size)
    disk = DiskTier(cache.kv_offloading_disk_dir, capacity, blocks.nbytes_per_block, cache.block_size, identity)
    log.info("KV disk tier: %s, up to %d blocks (%.2f GiB), %d there already", cache.kv_offloading_disk_dir,
             disk.capacity_blocks, capacity / 2**30, len(disk.blocks))
    return disk
