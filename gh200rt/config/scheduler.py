"""``SchedulerConfig``: how many requests and tokens one step takes."""
from __future__ import annotations

from dataclasses import dataclass, field

from gh200rt.config.flags import flag_help


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int = field(default=256, metadata=flag_help("most requests running in one step"))
    max_num_batched_tokens: int = field(default=2048, metadata=flag_help(
        "most tokens computed in one step; long prompts are prefilled in chunks of at most this"))
    async_scheduling: bool | None = field(default=None, metadata=flag_help(
        "launch each step before the previous step's tokens reach the host (it reads them on the device), so the "
        "host detokenizes and reports a step while the next one runs; the step launched ahead is the one the "
        "scheduler would take; a stop the host learns late costs one discarded row; a tier move waits for the "
        "step in flight; with speculative decoding or tensor parallelism the next step is launched once a step's "
        "tokens are taken in, and its report overlaps that step; default: on a GPU (1.07-1.26x decode on an "
        "H200), off on the CPU, where nothing overlaps (docs/ASYNC_SCHEDULING.md)"))

    def __post_init__(self):
        if self.max_num_seqs < 1:
            raise ValueError(f"--max-num-seqs must be at least 1, got {self.max_num_seqs}")
        if self.max_num_batched_tokens < 1:
            raise ValueError(f"--max-num-batched-tokens must be at least 1, got {self.max_num_batched_tokens}")
