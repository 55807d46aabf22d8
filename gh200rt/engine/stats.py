"""What the engine reports between steps: ``EngineStats`` (a snapshot the server's /metrics reads), with the
per-step token histogram behind ``vllm:iteration_tokens_total``."""
from __future__ import annotations

from dataclasses import dataclass, field

from gh200rt.histogram import Histogram


@dataclass
class EngineStats:
    num_running: int
    num_waiting: int
    kv_blocks_total: int
    kv_blocks_used: int              # held by requests
    kv_blocks_cached_free: int       # free but still holding a reusable prefix
    prefix_cache_lookups: int
    prefix_cache_hits: int
    prefix_cache_hit_tokens: int
    num_preemptions: int
    prompt_tokens: int
    generation_tokens: int
    layers_per_tier: dict[str, int] = field(default_factory=dict)   # "resident" / "streamed" / "direct" -> layers
    weight_bytes_copied: int = 0     # bytes copied into staging slots since start (streamed tier)
    copy_wait_seconds: float = 0.0   # time the compute side waited for a staging copy
    arena_weight_blocks: int = 0     # device arena blocks resident layer weights hold (the KV cache has the rest)
    retier_counts: dict[str, int] = field(default_factory=dict)   # "promote" / "demote" -> layers moved
    graph_captures: int = 0          # decode graphs captured (recaptures after a tier move included)
    graph_pool_bytes: int = 0        # device bytes the decode graphs' shared memory pool took
    experts_per_tier: dict[str, int] = field(default_factory=dict)   # an MoE model's routed experts per tier
    expert_bytes_copied: int = 0     # bytes of streamed experts copied into the expert ring (only when routed to)
    expert_bytes_read_direct: int = 0   # bytes of direct experts read in place (only when routed to)
    expert_swaps: int = 0            # dynamic tiers: resident experts swapped for more-used offloaded ones
    routed_tokens: dict[int, list[int]] = field(default_factory=dict)   # MoE layer -> pairs routed to each expert
    iteration_tokens: Histogram | None = None   # tokens each step batched (a copy)
    max_loras: int | None = None     # --max-loras with --enable-lora, else None (no LoRA metrics)
    running_lora_adapters: tuple[str, ...] = ()   # adapters of the running requests, each once, in batch order
    waiting_lora_adapters: tuple[str, ...] = ()   # adapters of the waiting requests, each once, in queue order
    # --async-scheduling: steps launched before the previous step's tokens reached the host (with speculative
    # decoding: before the previous step was reported)
    steps_launched_ahead: int = 0
    rows_discarded: int = 0          # rows of those steps whose sequence had stopped in the step before
    kv_host: object = None           # the host KV tier's kv.offload.HostTierReport, None with the tier off
    spec_decode: object = None       # speculative decoding's SpecDecodeStats (a copy), None with it off
    # cpu-tier experts: {"runs": ..., "pairs": ...}, each {"cpu": n, "device": n} by where they were computed
    cpu_expert_tier: dict = field(default_factory=dict)


def adapter_names(seqs) -> tuple[str, ...]:
    """The LoRA adapters of ``seqs``, each once, in order."""
    return tuple(dict.fromkeys(seq.lora.name for seq in seqs if seq.lora is not None))


# vLLM's buckets for vllm:iteration_tokens_total (tokens per engine step)
ITERATION_TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)


def iteration_tokens() -> Histogram:
    return Histogram("iteration_tokens_total", "Histogram of number of tokens per engine_step.",
                     ITERATION_TOKEN_BUCKETS)
