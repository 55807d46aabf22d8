"""Start a tensor-parallel engine's ranks from rank 0 (the engine's process): check that the model and this
machine allow N ranks, spawn the workers, load rank 0's shard beside them, and connect the process groups.

On the CPU the ranks split the cores this process may use: each sets torch's threads to its share (rank 0's
previous count comes back when the engine closes).
"""
from __future__ import annotations

import logging

import os
from datetime import timedelta

import torch

from gh200rt.config import EngineConfig
from gh200rt.distributed.rank_numa import rank_platform
from gh200rt.distributed.runner import TensorParallelRunner
from gh200rt.distributed.sharding import TensorShard
from gh200rt.distributed.worker import rank_report
from gh200rt.distributed.workers import TensorParallelWorkers
from gh200rt.engine.bootstrap import PlacedModel, execution_device, load_and_place
from gh200rt.loader.gguf_file import GGUFFile
from gh200rt.loader.load import read_arch
from gh200rt.loader.resolve import resolve_model_path

# how long any rank waits in a collective for the others (an idle worker waits for the next step without limit)
COLLECTIVE_TIMEOUT = timedelta(seconds=300)

log = logging.getLogger(__name__)


def usable_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def check_machine(config: EngineConfig, device: str) -> None:
    """Raise ValueError where this machine or the other flags cannot run ``--tensor-parallel-size``."""
    n = config.parallel.tensor_parallel_size
    flag = f"--tensor-parallel-size {n}"
    per_host = config.parallel.ranks_per_node
    if device == "cuda":
        gpus = torch.cuda.device_count()
        if per_host > gpus:
            raise ValueError(f"{flag}: this machine has {gpus} GPU(s), one per rank on it ({per_host}) is needed; "
                             f"give at most {gpus * config.parallel.nnodes}")
        if config.use_graphs("cuda"):
            raise ValueError(f"{flag}: tensor-parallel steps run eagerly for now; add --enforce-eager")
    else:
        cores = usable_cores()
        if per_host > cores:   # correct, only slower: the ranks take turns on the cores (a test can run TP=4 on 2)
            log.warning("%s: %d ranks share the %d CPU core(s) this process may use, one thread each; steps will "
                        "be slower than with at most %d ranks", flag, per_host, cores, cores)
        if config.use_graphs("cpu"):
            raise ValueError(f"{flag}: tensor-parallel steps run eagerly; drop --no-enforce-eager")


def start_ranks(config: EngineConfig, platform=None, poison: bool = False) -> tuple[PlacedModel, TensorParallelWorkers]:
    """Rank 0's placed shard and its running, connected workers."""
    n = config.parallel.tensor_parallel_size
    assert n > 1, n
    device = execution_device()
    check_machine(config, device)
    arch = read_arch(config.model.model)
    shard = TensorShard(0, n, arch)      # raises ValueError where the model cannot be split n ways
    path = resolve_model_path(config.model.model)
    if path.endswith(".gguf"):
        GGUFFile(path).check_shard(shard)   # a quantized block split between ranks: refused before any spawn
    per_host = config.parallel.ranks_per_node
    threads = max(1, usable_cores() // per_host) if device == "cpu" else torch.get_num_threads()
    previous_threads, previous_cpus = torch.get_num_threads(), os.sched_getaffinity(0)
    torch.set_num_threads(threads)
    workers = TensorParallelWorkers(config, arch, threads, COLLECTIVE_TIMEOUT, restore_threads=previous_threads,
                                    restore_cpus=previous_cpus)
    try:
        platform = rank_platform(platform, config, 0, per_host, device)
        placed = load_and_place(config, platform, poison=poison, shard=shard, agree_free=workers.smallest_free,
                                agree_draft=workers.agree_draft)
        workers.wait_ready(rank_report(placed))
        placed.loaded.model.connect(workers.connect(torch.device(device)))
    except BaseException:
        workers.close()
        raise
    return placed, workers


def make_runner(workers: TensorParallelWorkers, *args, **kwargs) -> TensorParallelRunner:
    return TensorParallelRunner(workers, *args, **kwargs)
