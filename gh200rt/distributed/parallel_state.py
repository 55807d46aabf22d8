"""The process groups of one tensor-parallel rank, as explicit data (no default process group, no globals).

Two groups over the same rendezvous store: ``control`` (gloo, CPU tensors) carries each step's inputs from rank 0
to the workers; ``data`` (gloo on the CPU, NCCL on GPUs) carries the model's collectives. The groups are built
directly from the store (``ProcessGroupGloo`` / ``ProcessGroupNCCL``), so nothing registers in
``torch.distributed``'s global state and an engine can be started and closed many times in one process.
A worker waits on the control group between steps for as long as rank 0 is idle, so its control timeout is long;
every other wait is bounded by ``timeout``.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from gh200rt.speculative.booking import DraftBooking

# a worker idles in the control group's broadcast until rank 0 sends the next step (rank 0 dying ends it sooner)
IDLE_TIMEOUT = timedelta(days=7)


def _gloo(store, prefix: str, rank: int, world_size: int, timeout: timedelta, hostname: str):
    opts = dist.ProcessGroupGloo._Options()
    opts._timeout = timeout
    opts._devices = [dist.ProcessGroupGloo.create_device(hostname=hostname)]
    return dist.ProcessGroupGloo(dist.PrefixStore(prefix, store), rank, world_size, opts)


def _nccl(store, prefix: str, rank: int, world_size: int, timeout: timedelta, hostname: str):
    opts = dist.ProcessGroupNCCL.Options()
    opts._timeout = timeout
    return dist.ProcessGroupNCCL(dist.PrefixStore(prefix, store), rank, world_size, opts)


def every_rank_value(store, key: str, rank: int, world_size: int, value: int, on_wait=None) -> list[int]:
    """Every rank's ``value`` through the store, in rank order; ``on_wait()`` runs while some rank has not written
    yet (it may raise)."""
    store.set(f"{key}/{rank}", str(value))
    keys = [f"{key}/{r}" for r in range(world_size)]
    while not store.check(keys):
        if on_wait is not None:
            on_wait()
        time.sleep(0.05)
    return [int(store.get(k)) for k in keys]


def smallest_across_ranks(store, key: str, rank: int, world_size: int, value: int, on_wait=None) -> int:
    """The smallest of every rank's ``value`` (e.g. free device memory, so that every rank plans for the
    smallest)."""
    return min(every_rank_value(store, key, rank, world_size, value, on_wait))


def agreed_draft_booking(store, rank: int, world_size: int, booking: DraftBooking, on_wait=None) -> DraftBooking:
    """Rank 0's draft booking on every rank: the draft runs unsharded on rank 0 and the others book what it takes,
    so that every rank makes rank 0's plan (the same layers in the same tiers, the same KV blocks)."""
    weights, kv = (every_rank_value(store, f"draft_{what}", rank, world_size, value, on_wait)[0]
                   for what, value in (("weights", booking.weight_bytes), ("kv", booking.kv_bytes_per_block)))
    return DraftBooking(weights, kv)


@dataclass
class ParallelState:
    rank: int
    world_size: int
    control: object          # ProcessGroupGloo
    data: object             # ProcessGroupGloo (CPU) or ProcessGroupNCCL (GPU)

    @classmethod
    def connect(cls, store, rank: int, world_size: int, device: torch.device, timeout: timedelta,
                hostname: str = "127.0.0.1") -> "ParallelState":
        """Build both groups (every rank calls this; it returns once all have). ``hostname``: this host's address
        as the others reach it (gloo's sockets)."""
        control_timeout = timeout if rank == 0 else IDLE_TIMEOUT
        control = _gloo(store, "control/", rank, world_size, control_timeout, hostname)
        make_data = _nccl if device.type == "cuda" else _gloo
        return cls(rank, world_size, control, make_data(store, "data/", rank, world_size, timeout, hostname))

    @property
    def is_first(self) -> bool:
        return self.rank == 0

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum ``tensor`` over the ranks, in place; returns it."""
        self.data.allreduce([tensor]).wait()
        return tensor

    def gather_last_dim(self, tensor: torch.Tensor) -> torch.Tensor:
        """On rank 0, every rank's ``tensor`` concatenated along the last dimension in rank order; on the others,
        their own ``tensor`` (unused)."""
        tensor = tensor.contiguous()
        opts = dist.GatherOptions()
        opts.rootRank = 0
        parts = [[torch.empty_like(tensor) for _ in range(self.world_size)]] if self.is_first else []
        self.data.gather(parts, [tensor], opts).wait()
        return torch.cat(parts[0], dim=-1) if self.is_first else tensor

    def broadcast_control(self, tensor: torch.Tensor) -> torch.Tensor:
        """Rank 0's ``tensor`` (a CPU tensor) into every rank's ``tensor``, in place."""
        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        self.control.broadcast([tensor], opts).wait()
        return tensor
