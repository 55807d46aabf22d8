"""``GraphConfig``: which decode steps replay CUDA graphs."""
from __future__ import annotations

from dataclasses import dataclass, field

from gh200rt.config.flags import flag_help

MAX_GRAPH_BATCH = 256


@dataclass(frozen=True)
class GraphConfig:
    enforce_eager: bool | None = field(default=None, metadata=flag_help(
        "run every step eagerly (no CUDA graphs); default: decode steps replay CUDA graphs on a GPU and run "
        "eagerly on the CPU (--no-enforce-eager runs the CPU through the same bucketed, padded path)"))
    max_graph_batch: int | None = field(default=None, metadata=flag_help(
        "largest decode batch replayed from a graph, in rows (buckets 1, 2, 4, 8, then steps of 8; a sequence that "
        "verifies k drafted tokens takes 1 + k rows); larger batches run eagerly; default: min(--max-num-seqs x "
        f"(1 + k), {MAX_GRAPH_BATCH})"))
    check_graph_addresses: bool = field(default=False, metadata=flag_help(
        "debug: before every replay, check that each address the graph saw at capture (input buffers, KV cache, "
        "weights, staging slots) is unchanged"))

    def __post_init__(self):
        if self.max_graph_batch is not None and self.max_graph_batch < 1:
            raise ValueError(f"--max-graph-batch must be at least 1, got {self.max_graph_batch}")
