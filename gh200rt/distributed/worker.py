"""A tensor-parallel worker process (rank 1..N-1): load the rank's shard, report ready, then run every step rank 0
sends until it says stop. A worker decides nothing: no scheduler, sampler or tier controller runs here; it makes
the placement moves rank 0 sends with a step before running it, at rank 0's arena runs (``placement_sync.py``), and
copies the LoRA adapters rank 0 put in slots into its own (``worker_lora.py``).

Whatever ends the worker other than a stop (an error loading its shard, a failed collective) is written to the
rendezvous store under ``error/<rank>`` for rank 0 to report, and the process exits non-zero. A thread watches the
parent: a worker whose engine process is gone exits at once rather than linger.
"""
from __future__ import annotations

import functools
import json
import os
import signal
import sys
import threading
import time
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist

from gh200rt.distributed.hosts import Rendezvous
from gh200rt.distributed.parallel_state import ParallelState, agreed_draft_booking, smallest_across_ranks
from gh200rt.distributed.placement_sync import apply_moves, geometry, placement
from gh200rt.distributed.rank_numa import rank_platform
from gh200rt.distributed.sharding import TensorShard
from gh200rt.distributed.step_channel import receive_step
from gh200rt.distributed.worker_lora import WorkerAdapters
from gh200rt.kv.host_blocks import HostKVLayers, device_visible
from gh200rt.kv.offload import HostKVMirror, PoolBlocks

PARENT_POLL_SECONDS = 0.5


def _exit_with_parent(parent_pid: int) -> None:
    def watch():
        while os.getppid() == parent_pid:
            time.sleep(PARENT_POLL_SECONDS)
        os._exit(3)
    threading.Thread(target=watch, name="gh200rt-tp-parent-watch", daemon=True).start()


def rank_report(placed) -> dict:
    """What a rank holds once loaded (rank 0 keeps every rank's: ``TensorParallelWorkers.reports``)."""
    return {"weight_bytes": placed.loaded.weight_bytes, "num_kv_blocks": placed.plan.num_kv_blocks,
            "kv_heads": placed.loaded.arch.num_kv_heads, "tiers": placed.store.tier_counts,
            "layer_tiers": [tier.value for tier in placed.store.tiers], "host_slab_bytes": placed.store.host_slab_bytes(),
            "expert_tiers": [[layer, [tier.value for tier in tiers]] for layer, tiers in placed.store.expert_tiers.items()],
            "arena": geometry(placed.store)}


def final_report(store) -> dict:
    """A worker's placement when it stops (rank 0 compares it with its own: no run or slab lost on any rank)."""
    pool = store.arena.pool if store.arena is not None else None
    return {"placement": sorted([*unit, tier.value, start] for unit, (tier, start) in placement(store).items()),
            "runs": sorted(pool.runs.items()) if pool else [], "free_blocks": pool.num_free if pool else 0,
            "num_blocks": pool.num_blocks if pool else 0, "layer_slabs": sorted(store.slabs),
            "expert_slabs": sorted(store.expert_slabs), "ledger": dict(store.ledger.by_kind) if store.ledger else {},
            "routing_counts": [[layer, counts.tolist()] for layer, counts in store.model.routing_counts().items()]}


def run_worker(shard: TensorShard, config, meet: Rendezvous, threads: int, parent_pid: int | None,
               timeout: timedelta) -> None:
    """What rank ``shard.rank`` runs (``workers.py`` and ``node.py`` start it through ``rank_process.py``; a
    process torchrun started calls it itself, ``parent_pid`` None)."""
    from gh200rt.engine.bootstrap import execution_device, load_and_place
    from gh200rt.engine.host_kv_tier import host_reads
    from gh200rt.engine.model_runner import ModelRunner
    if parent_pid is not None:
        _exit_with_parent(parent_pid)
        signal.signal(signal.SIGINT, signal.SIG_IGN)     # Ctrl-C reaches the whole group: rank 0 stops the workers
    torch.set_num_threads(threads)
    rank = shard.rank
    local_rank, per_host = meet.local_ranks[rank]
    store = dist.TCPStore(meet.master_addr, meet.master_port, shard.world_size, is_master=False, timeout=timeout)
    try:
        device = execution_device()
        if device == "cuda":
            torch.cuda.set_device(local_rank)
        platform = rank_platform(None, config, local_rank, per_host, device)
        placed = load_and_place(config, platform, shard=shard, agree_free=functools.partial(
            smallest_across_ranks, store, "free", rank, shard.world_size), agree_draft=functools.partial(
            agreed_draft_booking, store, rank, shard.world_size))
        model = placed.loaded.model
        arena = placed.store.arena
        store.set(f"ready/{rank}", json.dumps(rank_report(placed)))
        state = ParallelState.connect(store, rank, shard.world_size, torch.device(device), timeout,
                                      meet.gloo_hostname())
        model.connect(state)
        runner = ModelRunner(model, arena.kv_caches(), config.cache.block_size, device, hooks=placed.store,
                             batch_invariant=config.model.batch_invariant)
        adapters = WorkerAdapters(placed, config, shard, device, store) if config.lora.enable_lora else None
        host_kv = None     # this rank's share of the host KV tier, made when rank 0's first step says its size
        while (received := receive_step(state)) is not None:
            step, moves, kv = received
            apply_moves(placed.store, moves)
            if kv.host_blocks and host_kv is None:
                host_kv = HostKVMirror(PoolBlocks(arena.kv_caches(), arena.blocks()), kv.host_blocks,
                                       pin_memory=device == "cuda")
                if host_reads(config, arena.kv_caches(), device) != "load":    # rank 0's tables may name its slots
                    runner.read_host_blocks(HostKVLayers(arena.kv_caches(), device_visible(
                        host_kv.host, torch.device(device)), arena.pool.num_blocks))
            if host_kv is not None:
                host_kv.apply(kv.stores, kv.loads)
            if adapters is None:
                runner.execute(step)
                continue
            adapters.begin(step)
            try:
                runner.execute(step)
            finally:
                adapters.end()
        store.set(f"final/{rank}", json.dumps(final_report(placed.store)))
        placed.store.close()
    except BaseException as e:  # noqa: BLE001 - any failure is reported to rank 0, then the worker exits
        try:
            store.set(f"error/{rank}", f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=-6)}")
        except Exception:  # noqa: BLE001 - rank 0 (the store's host) is gone: nothing to tell
            pass
        sys.exit(1)
