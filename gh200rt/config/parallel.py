"""``ParallelConfig``: tensor parallelism, its ranks and the hosts they run on."""
from __future__ import annotations

from dataclasses import dataclass, field

from gh200rt.config.flags import flag_help


@dataclass(frozen=True)
class ParallelConfig:
    tensor_parallel_size: int = field(default=1, metadata=flag_help(
        "ranks the model is sharded over (docs/TENSOR_PARALLEL.md): this process and N-1 worker processes on this "
        "host, each holding 1/N of the attention heads, MLP and vocabulary (on the CPU each takes 1/N of the "
        "cores); dense Llama / Mistral / Qwen2 / Qwen3 safetensors checkpoints"))
    nnodes: int = field(default=1, metadata=flag_help(
        "hosts the ranks run on, tensor-parallel-size / nnodes each (docs/TENSOR_PARALLEL.md: the commands for two "
        "hosts); every host runs the same command with its own --node-rank"))
    node_rank: int = field(default=0, metadata=flag_help(
        "this host's index among --nnodes: 0 runs rank 0 (the engine and server), the others only run their ranks"))
    master_addr: str = field(default="127.0.0.1", metadata=flag_help(
        "address of node 0, where the ranks meet (its TCP store); with --nnodes > 1, one the other hosts reach"))
    master_port: int | None = field(default=None, metadata=flag_help(
        "port of node 0's TCP store; default: a free port on one host, required with --nnodes > 1"))

    def __post_init__(self):
        if self.tensor_parallel_size < 1:
            raise ValueError(f"--tensor-parallel-size must be at least 1, got {self.tensor_parallel_size}")
        if self.nnodes < 1 or self.tensor_parallel_size % self.nnodes:
            raise ValueError(f"--nnodes {self.nnodes} must be at least 1 and divide --tensor-parallel-size "
                             f"{self.tensor_parallel_size} (each host runs as many ranks)")
        if not 0 <= self.node_rank < self.nnodes:
            raise ValueError(f"--node-rank {self.node_rank} must be in 0..{self.nnodes - 1} (--nnodes {self.nnodes})")
        if self.nnodes > 1 and self.master_port is None:
            raise ValueError(f"--nnodes {self.nnodes}: give --master-port (and --master-addr, node 0's address), the "
                             "same on every host")

    @property
    def ranks_per_node(self) -> int:
        return self.tensor_parallel_size // self.nnodes

    @property
    def node_ranks(self) -> range:
        """The global ranks this host runs (node 0's process is rank 0 itself)."""
        return range(self.node_rank * self.ranks_per_node, (self.node_rank + 1) * self.ranks_per_node)
