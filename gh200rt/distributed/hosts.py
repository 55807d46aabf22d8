"""Where the ranks meet and which of them this process starts: one host (a free port on 127.0.0.1), several hosts
(``--nnodes``, ``--node-rank``, ``--master-addr``, ``--master-port``, vLLM's names) or a process torchrun started
(its ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``; the one module
that reads them). Host k of ``--nnodes`` runs global ranks ``[k*L, (k+1)*L)`` with L = size / nnodes, and local rank
j of a host drives its GPU j. Rank 0 hosts the rendezvous ``TCPStore``, unless torchrun's agent already hosts one.
"""
from __future__ import annotations

import dataclasses
import os
import socket
from dataclasses import dataclass


@dataclass(frozen=True)
class Rendezvous:
    master_addr: str
    master_port: int            # 0: rank 0 binds a free port (one host)
    spawn: tuple[int, ...]      # global ranks this process starts as worker processes
    local_ranks: dict           # global rank -> (local rank, ranks on its host)
    own_rank: int | None        # the rank this process is itself (0 for the engine; None: a node agent)
    agent_store: bool = False   # torchrun's agent hosts the store at master_port: every rank is a client

    @property
    def multi_host(self) -> bool:
        return self.master_addr not in ("127.0.0.1", "localhost", "::1")

    def gloo_hostname(self) -> str:
        """This host's address as the other hosts reach it (the interface that routes to node 0)."""
        if not self.multi_host:
            return "127.0.0.1"
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((self.master_addr, self.master_port or 1))
            return s.getsockname()[0]


def torchrun_config(config):
    """``config`` with the ranks of torchrun's environment, where this process was started by torchrun."""
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return config
    world = int(os.environ["WORLD_SIZE"])
    if config.parallel.tensor_parallel_size not in (1, world):
        raise ValueError(f"--tensor-parallel-size {config.parallel.tensor_parallel_size} differs from torchrun's "
                         f"WORLD_SIZE {world}; leave it out or give {world}")
    parallel = dataclasses.replace(config.parallel, tensor_parallel_size=world,
                                   master_addr=os.environ.get("MASTER_ADDR", "127.0.0.1"),
                                   master_port=int(os.environ.get("MASTER_PORT", 29500)))
    return dataclasses.replace(config, parallel=parallel)


def rendezvous(config) -> Rendezvous:
    """Which ranks this process starts and how they meet, from ``config.parallel`` or torchrun's environment."""
    p = config.parallel
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:       # torchrun: one process per rank, none spawned
        rank, local = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", 0))
        per_host = int(os.environ.get("LOCAL_WORLD_SIZE", p.tensor_parallel_size))
        return Rendezvous(p.master_addr, p.master_port, (), {rank: (local, per_host)}, rank,
                          agent_store=os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True")
    per_host = p.ranks_per_node
    local = {rank: (j, per_host) for j, rank in enumerate(p.node_ranks)}
    own = 0 if p.node_rank == 0 else None
    spawn = tuple(r for r in p.node_ranks if r != own)
    return Rendezvous(p.master_addr, p.master_port or 0, spawn, local, own)
