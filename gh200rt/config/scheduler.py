"""``SchedulerConfig``: how many requests and tokens one step takes."""
from __future__ import annotations

from dataclasses import dataclass, field

from gh200rt.config.flags import _help


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int = field(default=256, metadata=_help("most requests running in one step"))
    max_num_batched_tokens: int = field(default=2048, metadata=_help(
        "most tokens computed in one step; long prompts are prefilled in chunks of at most this"))
    async_scheduling: bool = field(default=False, metadata=_help(
        "launch the next decode step before this step's tokens reach the host: it reads them on the device, and "
        "the host detokenizes and reports this step while the next one runs (decode steps of requests without "
        "structured output, penalties, bad words or pending min_tokens; steps with a prompt chunk or a waiting "
        "request, a tier controller, LoRA or tensor parallelism run one at a time); a request that stops on a "
        "stop string or EOS costs the next step one discarded row"))

    def __post_init__(self):
        if self.max_num_seqs < 1:
            raise ValueError(f"--max-num-seqs must be at least 1, got {self.max_num_seqs}")
        if self.max_num_batched_tokens < 1:
            raise ValueError(f"--max-num-batched-tokens must be at least 1, got {self.max_num_batched_tokens}")
