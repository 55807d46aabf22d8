"""A host other than rank 0's: run this host's ranks until rank 0 stops them (``python -m gh200rt.serve ...
--node-rank K``, or a process torchrun started with ``RANK`` > 0). No scheduler, server or sampler runs here.

A node agent (``--node-rank`` K > 0) spawns its ranks and watches them: a rank that dies without writing its error
(SIGKILL, out of memory) gets one written for it to the store, so rank 0 names it, and the agent stops its other
ranks and exits non-zero; once every rank has stopped cleanly it exits 0. SIGTERM and SIGINT stop its ranks.
"""
from __future__ import annotations

import logging
import os
import signal
import time
from datetime import timedelta

import torch.distributed as dist

from gh200rt.distributed.hosts import Rendezvous
from gh200rt.distributed.launch import COLLECTIVE_TIMEOUT, usable_cores
from gh200rt.distributed.sharding import TensorShard
from gh200rt.distributed.rank_process import RankProcess
from gh200rt.distributed.worker import run_worker
from gh200rt.distributed.workers import exit_reason
from gh200rt.loader.load import read_arch

log = logging.getLogger("gh200rt.distributed")
POLL_SECONDS = 0.1


def run_ranks(config, meet: Rendezvous, timeout: timedelta = COLLECTIVE_TIMEOUT) -> int:
    """Run this host's ranks; the process's exit code."""
    n = config.parallel.tensor_parallel_size
    arch = read_arch(config.model.model)
    per_host = next(iter(meet.local_ranks.values()))[1]
    threads = max(1, usable_cores() // per_host)
    if meet.own_rank is not None:                     # torchrun started this rank: it is the worker itself
        run_worker(TensorShard(meet.own_rank, n, arch), config, meet, threads, None, timeout)
        return 0
    processes = {rank: RankProcess(rank, (TensorShard(rank, n, arch), config, meet, threads, os.getpid(), timeout))
                 for rank in meet.spawn}
    log.info("node %d: ranks %s started, meeting rank 0 at %s:%d", config.parallel.node_rank, list(processes),
             meet.master_addr, meet.master_port)
    stopping = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stopping.append(True))
    try:
        while not stopping:
            codes = {rank: p.exitcode for rank, p in processes.items()}
            failed = {rank: code for rank, code in codes.items() if code not in (None, 0)}
            if failed:
                rank, code = next(iter(failed.items()))
                _report(meet, n, rank, exit_reason(code))
                log.error("rank %d failed: %s; stopping this node's ranks", rank, exit_reason(code))
                return 1
            if all(code == 0 for code in codes.values()):
                return 0
            time.sleep(POLL_SECONDS)
        return 0
    finally:
        for process in processes.values():
            if process.is_alive():
                process.kill()
            process.join()


def _report(meet: Rendezvous, world_size: int, rank: int, reason: str) -> None:
    """Write a dead rank's reason for rank 0, unless the rank wrote its own."""
    try:
        store = dist.TCPStore(meet.master_addr, meet.master_port, world_size, is_master=False,
                              timeout=timedelta(seconds=5))
        if not store.check([f"error/{rank}"]):
            store.set(f"error/{rank}", reason)
    except Exception:  # noqa: BLE001 - rank 0 is gone: nobody to tell
        pass
