"""``MemoryConfig``: the device memory budget and where the weights live in it or in host memory (offload
mode, per-layer tiers, MoE experts, the staging ring, dynamic retiering, the host weights' format and cache)."""
from __future__ import annotations

from dataclasses import dataclass, field

from gh200rt.config.flags import flag_help, parse_layer_tiers, parse_size
from gh200rt.platform.bandwidth import read_profile_file

OFFLOAD_MODES = ("auto", "none", "stream", "direct", "dynamic")
MOE_EXPERT_TIERS = ("auto", "resident", "direct", "stream", "cpu")
HOST_WEIGHT_DTYPES = ("auto", "fp32", "bf16", "fp16", "int8", "int4", "int4-g128", "fp8")
DIRECT_SCALES = ("device", "host")


@dataclass(frozen=True)
class MemoryConfig:
    device_memory_budget: str | None = field(default=None, metadata=flag_help(
        "device memory gh200rt may use, e.g. 2GiB; on CPU it stands in for HBM. "
        "Default: free device memory x --gpu-memory-utilization (on CPU: the weights plus up to 2GiB of KV cache)"))
    gpu_memory_utilization: float = field(default=0.9, metadata=flag_help(
        "fraction of free device memory to use when no budget is given"))
    offload: str = field(default="auto", metadata=flag_help(
        "where weights live: auto (planner decides; dynamic where the platform makes streaming cheap), none "
        "(all resident), stream, direct, dynamic (layers move between resident and streamed as KV demand changes)",
        choices=OFFLOAD_MODES))
    layer_tiers: str | None = field(default=None, metadata=flag_help(
        "per-layer override, e.g. 0-3:streamed,7:direct; an MoE layer's routed experts: 0-23:experts=direct"))
    moe_expert_tier: str = field(default="auto", metadata=flag_help(
        "where an MoE model's routed experts live, each on its own: resident, direct (read in place, only the "
        "experts a step routes to), stream (copied in only when routed to) or auto (the planner decides from the "
        "budget: resident while they fit, then as many resident per layer as fit and the rest direct, or streamed "
        "where the link is slow; with --offload none/stream/direct, experts follow it), or cpu (kept in host memory "
        "and computed by the host's cores on the tokens routed to them; a step that routes more tokens to one than "
        "--moe-cpu-max-tokens computes it on the device instead)", choices=MOE_EXPERT_TIERS))
    cpu_moe: bool = field(default=False, metadata=flag_help(
        "every routed expert on the cpu tier (llama.cpp's --cpu-moe; the same as --moe-expert-tier cpu)"))
    n_cpu_moe: int | None = field(default=None, metadata=flag_help(
        "the routed experts of the first N layers on the cpu tier (llama.cpp's --n-cpu-moe), the others placed "
        "as --moe-expert-tier says"))
    moe_cpu_threads: int | None = field(default=None, metadata=flag_help(
        "threads that compute cpu-tier experts, on the CPUs nearest the GPU (default: those CPUs less one for "
        "the engine; on the CPU platform, torch's thread count)"))
    moe_cpu_max_tokens: int | None = field(default=None, metadata=flag_help(
        "a step that routes more tokens than this to a cpu-tier expert computes it on the device (read in place "
        "or streamed, as an offloaded expert is): a prefill's many tokens on the GPU, a decode's few on the CPU; "
        "default: where the cost model finds the host's cores as fast as the device (the plan prints it; "
        "--profile-file's measured figures make it this host's), no limit on the CPU platform"))
    staging_slots: int | None = field(default=None, metadata=flag_help("staging ring depth K; default: planner"))
    prefetch_distance: int | None = field(default=None, metadata=flag_help(
        "prefetch d streamed layers ahead; default: planner"))
    retier_interval_steps: int = field(default=8, metadata=flag_help(
        "--offload dynamic: at least this many steps between two tier moves"))
    retier_min_dwell_seconds: float = field(default=2.0, metadata=flag_help(
        "--offload dynamic: at least this many seconds between two tier moves"))
    retier_max_step_seconds: float | None = field(default=None, metadata=flag_help(
        "--offload dynamic: a TPOT target: stream no layer that would make a step take longer, and promote "
        "layers back while steps take longer (default: KV demand alone decides)"))
    prefetch_across_steps: bool = field(default=True, metadata=flag_help(
        "copy the next step's first streamed layers during the tail of this one (off: each step starts its "
        "own copies)"))
    kv_cache_min_tokens: int | None = field(default=None, metadata=flag_help(
        "KV cache capacity the planner must leave room for, in tokens"))
    host_weight_dtype: str = field(default="auto", metadata=flag_help(
        "format of offloaded weights in host memory (fp8: e4m3 with a scale per output channel; int4: a float32 "
        "scale and minimum per 32 columns, 6 bits a weight; int4-g128: per 128 columns, 4.5 bits a weight, for "
        "the largest MoE models; auto keeps an FP8 or GGUF checkpoint's own quantized weights and a dense "
        "checkpoint's compute dtype, so offloading never rounds a weight)", choices=HOST_WEIGHT_DTYPES))
    direct_scales: str = field(default="device", metadata=flag_help(
        "on a GPU, where a direct layer's quantized weights keep their scales (and int4 minimums): device (in "
        "device memory, booked against the KV cache: only the codes cross the link; int4 with groups of 32 reads "
        "a third fewer bytes) or host (beside the codes). Dense host weights have none; the CPU reads in place",
        choices=DIRECT_SCALES))
    host_weight_cache_dir: str | None = field(default=None, metadata=flag_help(
        "keep quantized host slabs (--host-weight-dtype int8, int4 or fp8 of a dense checkpoint) in this directory "
        "between runs, keyed by the checkpoint's files and the options: a restart reads them instead of quantizing "
        "again; default: quantize at every start"))
    platform: str | None = field(default=None, metadata=flag_help(
        "hardware profile for bandwidths (gh200-96g, h100-sxm, ...); default: detected"))
    profile_file: str | None = field(default=None, metadata=flag_help(
        "measured bandwidth profile (JSON) whose figures replace the built-in table's for the planner: the one "
        "scripts/validate_gpu.py (or python -m gh200rt.bench bandwidth --profile-out) wrote on this host; default: the "
        "built-in figures of the detected profile (or --platform)"))
    bind_threads: bool = field(default=True, metadata=flag_help(
        "on a GPU host, run the engine's threads on the CPUs of the GPU's NUMA node (within those the process "
        "may use)"))

    def __post_init__(self):
        parse_size(self.device_memory_budget, "--device-memory-budget")
        parse_layer_tiers(self.layer_tiers)
        if self.profile_file is not None:
            read_profile_file(self.profile_file)   # its base profile is checked once the platform is known
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(f"--gpu-memory-utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if self.offload not in OFFLOAD_MODES:
            raise ValueError(f"--offload {self.offload!r}: choose one of {', '.join(OFFLOAD_MODES)}")
        if self.moe_expert_tier not in MOE_EXPERT_TIERS:
            raise ValueError(f"--moe-expert-tier {self.moe_expert_tier!r}: choose one of {', '.join(MOE_EXPERT_TIERS)}")
        if self.cpu_moe and self.moe_expert_tier not in ("auto", "cpu"):
            raise ValueError(f"--cpu-moe puts every routed expert on the cpu tier; drop it or --moe-expert-tier "
                             f"{self.moe_expert_tier}")
        if self.cpu_moe and self.n_cpu_moe is not None:
            raise ValueError("--cpu-moe already puts every layer's experts on the cpu tier; give it or --n-cpu-moe, "
                             "not both")
        if self.n_cpu_moe is not None and self.n_cpu_moe < 0:
            raise ValueError(f"--n-cpu-moe must be 0 or more, got {self.n_cpu_moe}")
        if self.moe_cpu_threads is not None and self.moe_cpu_threads < 1:
            raise ValueError(f"--moe-cpu-threads must be at least 1, got {self.moe_cpu_threads}")
        if self.moe_cpu_max_tokens is not None and self.moe_cpu_max_tokens < 1:
            raise ValueError(f"--moe-cpu-max-tokens must be at least 1, got {self.moe_cpu_max_tokens}")
        if self.host_weight_dtype not in HOST_WEIGHT_DTYPES:
            raise ValueError(f"--host-weight-dtype {self.host_weight_dtype!r}: choose one of "
                             f"{', '.join(HOST_WEIGHT_DTYPES)}")
        if self.direct_scales not in DIRECT_SCALES:
            raise ValueError(f"--direct-scales {self.direct_scales!r}: choose one of {', '.join(DIRECT_SCALES)}")
        if self.staging_slots is not None and self.staging_slots < 1:
            raise ValueError(f"--staging-slots must be at least 1, got {self.staging_slots}")
        if self.prefetch_distance is not None and self.prefetch_distance < 0:
            raise ValueError(f"--prefetch-distance must be 0 or more, got {self.prefetch_distance}")
        if (self.staging_slots is not None and self.prefetch_distance is not None
                and self.prefetch_distance >= self.staging_slots):
            raise ValueError(f"--prefetch-distance ({self.prefetch_distance}) must be less than --staging-slots "
                             f"({self.staging_slots}): a prefetch may not overwrite a slot still in use")
        if self.retier_interval_steps < 1:
            raise ValueError(f"--retier-interval-steps must be at least 1, got {self.retier_interval_steps}")
        if self.retier_min_dwell_seconds < 0:
            raise ValueError(f"--retier-min-dwell-seconds must be 0 or more, got {self.retier_min_dwell_seconds}")
        if self.retier_max_step_seconds is not None and self.retier_max_step_seconds <= 0:
            raise ValueError(f"--retier-max-step-seconds must be positive, got {self.retier_max_step_seconds}")
        if self.kv_cache_min_tokens is not None and self.kv_cache_min_tokens < 0:
            raise ValueError(f"--kv-cache-min-tokens must be 0 or more, got {self.kv_cache_min_tokens}")

    @property
    def budget_bytes(self) -> int | None:
        return parse_size(self.device_memory_budget, "--device-memory-budget")

    @property
    def expert_tier(self) -> str:
        """``--moe-expert-tier``, with ``--cpu-moe`` read as cpu."""
        return "cpu" if self.cpu_moe else self.moe_expert_tier

    def asks_cpu_experts(self) -> bool:
        """Whether any option puts a routed expert on the cpu tier."""
        return self.expert_tier == "cpu" or bool(self.n_cpu_moe) or "cpu" in self.expert_tier_overrides.values()

    @property
    def tier_overrides(self) -> dict[int, str]:
        return parse_layer_tiers(self.layer_tiers)

    @property
    def expert_tier_overrides(self) -> dict[int, str]:
        """MoE layer -> the tier of all its routed experts (``--layer-tiers L:experts=TIER``)."""
        return parse_layer_tiers(self.layer_tiers, experts=True)
