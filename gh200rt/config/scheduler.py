"""``SchedulerConfig``: how many requests and tokens one step takes."""
from __future__ import annotations

from dataclasses import dataclass, field

from gh200rt.config.flags import flag_help

GPU_STEP_TOKENS = 2048
CPU_STEP_TOKENS = 512


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int = field(default=256, metadata=flag_help("most requests running in one step"))
    max_num_batched_tokens: int | None = field(default=None, metadata=flag_help(
        "most tokens computed in one step; long prompts are prefilled in chunks of at most this; default: 2048 on a "
        "GPU, 512 on the CPU, where a step's time grows with its tokens from a few dozen on, so that smaller steps "
        "give a burst's first tokens sooner at the same throughput (served TTFT p50 0.26 s against 0.40 s at 2048 on "
        "a Zen 5, docs/BENCHMARKS.md); the LLM class asks 2048 (an offline batch: 1.05x the tokens/s there)"))
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
        if self.max_num_batched_tokens is not None and self.max_num_batched_tokens < 1:
            raise ValueError(f"--max-num-batched-tokens must be at least 1, got {self.max_num_batched_tokens}")

    def step_tokens(self, on_cpu: bool) -> int:
        """Most tokens one step computes: ``--max-num-batched-tokens``, else the platform's default."""
        if self.max_num_batched_tokens is not None:
            return self.max_num_batched_tokens
        return CPU_STEP_TOKENS if on_cpu else GPU_STEP_TOKENS
