"""Frozen, validated configuration. Composes model -> cache -> scheduler -> memory -> engine.

Every field carries its help text in ``metadata["help"]``; the command-line flags of
``generate``, ``serve`` and ``plan`` are generated from these fields (``gh200rt.cli_args``),
so flags and config never drift. Invalid values raise ``ValueError`` naming the flag.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from gh200rt.platform.bandwidth import read_profile_file
from gh200rt.weights.tiers import Tier

DEFAULT_MODEL = "smollm2-135m"
DTYPES = ("auto", "float32", "bfloat16", "float16")
OFFLOAD_MODES = ("auto", "none", "stream", "direct", "dynamic")
MOE_EXPERT_TIERS = ("auto", "resident", "direct", "stream")
TIERS = tuple(tier.value for tier in Tier)
CPU_KERNELS = ("native", "torch")
CPU_ROUTES = ("auto", "bf16", "fp16", "fp32")  # platform/cpu_features.py: ROUTES, and auto (detect)
# a forced route computes in one dtype: --dtype may name it or stay auto (fp16 computes in float32 with fp16
# weights, which no --dtype names)
_ROUTE_DTYPES = {"bf16": "bfloat16", "fp32": "float32"}
KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2")  # vLLM's values; fp8 = fp8_e4m3
POOLING_TYPES = ("LAST", "MEAN")  # engine/pooling.py; vLLM's PoolerConfig.pooling_type names
HOST_WEIGHT_DTYPES = ("auto", "fp32", "bf16", "fp16", "int8", "int4", "fp8")

_SIZE_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3,
    "t": 1000**4, "tb": 1000**4,
    "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4,
}


def parse_size(text: str | int | None, flag: str = "size") -> int | None:
    """'2GiB' -> 2147483648, '512MB' -> 512000000, 1024 -> 1024, None -> None."""
    if text is None or isinstance(text, int):
        if isinstance(text, int) and text <= 0:
            raise ValueError(f"{flag} must be positive, got {text}")
        return text
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", str(text))
    unit = m.group(2).lower() if m else None
    if not m or unit not in _SIZE_UNITS:
        raise ValueError(f"{flag}: cannot read {text!r} as a size; write e.g. 2GiB, 512MiB, 8GB or a byte count")
    value = int(float(m.group(1)) * _SIZE_UNITS[unit])
    if value <= 0:
        raise ValueError(f"{flag} must be positive, got {text!r}")
    return value


def parse_layer_tiers(text: str | None, experts: bool = False) -> dict[int, str]:
    """'0-3:streamed,7:direct' -> {0: 'streamed', 1: ..., 7: 'direct'}; with ``experts``, the parts that place an
    MoE layer's routed experts instead: '0-3:experts=direct' -> {0: 'direct', ...} (the layers' own parts are
    skipped, and the other way round)."""
    if not text:
        return {}
    tiers: dict[int, str] = {}
    for part in text.split(","):
        layers, sep, tier = part.strip().partition(":")
        expert_part = tier.startswith("experts=")
        tier = tier.removeprefix("experts=")
        if not sep or tier not in TIERS:
            raise ValueError(f"--layer-tiers: {part!r} is not LAYERS:TIER or LAYERS:experts=TIER with TIER one of "
                             f"{', '.join(TIERS)} (example: --layer-tiers 0-3:streamed,7:direct,0-47:experts=direct)")
        if expert_part != experts:
            continue
        lo, _, hi = layers.partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()):
            raise ValueError(f"--layer-tiers: {layers!r} is not a layer index or range like 4-9")
        for i in range(int(lo), int(hi or lo) + 1):
            tiers[i] = tier
    return tiers


def _help(text: str, **extra) -> dict:
    return {"help": text, **extra}


@dataclass(frozen=True)
class ModelConfig:
    model: str = field(default=DEFAULT_MODEL, metadata=_help(
        "Hugging Face directory, .gguf file, or alias (smollm2-135m)"))
    dtype: str = field(default="auto", metadata=_help(
        "compute dtype; auto = on CPU the fastest accurate route (bfloat16 through oneDNN with AVX-512 BF16 "
        "or AMX, else float32 activations with fp16 linear weights through fbgemm, else float32), on GPU the "
        "checkpoint's dtype; float32 is the exact reference", choices=DTYPES))
    max_model_len: int | None = field(default=None, metadata=_help(
        "longest prompt + completion in tokens; default: the model's context length"))
    seed: int = field(default=0, metadata=_help("seed for requests that give none"))
    max_logprobs: int = field(default=20, metadata=_help(
        "most logprobs a request may ask for per token (logprobs, top_logprobs, prompt_logprobs; -1 in a request "
        "means the whole vocabulary and must fit this bound too); -1 = no bound (vLLM's name and default)"))
    cpu_kernels: str = field(default="native", metadata=_help(
        "small ops of a CPU model (RMSNorm, RoPE, KV store, decode attention, SiLU) and its float32 linears of up "
        "to 8 rows: native = C loops built once per machine with the system's C compiler (torch ops where none "
        "is found), torch = torch ops and oneDNN only",
        choices=CPU_KERNELS))
    cpu_route: str = field(default="auto", metadata=_help(
        "CPU compute route: auto = detected from the CPU's features (see --dtype auto); bf16 = bf16 weights and "
        "activations through oneDNN; fp16 = float32 activations, fp16 linear weights through fbgemm (and the "
        "native fp16 linear for few rows); fp32 = the exact float32 reference. A forced route must run here "
        "(start-up says why not); ignored on a GPU", choices=CPU_ROUTES))
    batch_invariant: bool = field(default=False, metadata=_help(
        "CPU: a request's tokens do not depend on which other requests share its steps (every step's linears in "
        "fixed blocks of rows, decodes too; slower, docs/BENCHMARKS.md); without it only prompt positions are "
        "computed alike however the prompt was split or batched (the prefix cache's guarantee)"))
    pooling_type: str = field(default="LAST", metadata=_help(
        "how /v1/embeddings and LLM.embed pool the final norm's hidden states into one vector: LAST = the last "
        "input token's (vLLM's default for decoder models), MEAN = the mean over every input token; vLLM's "
        "--override-pooler-config '{\"pooling_type\": ...}'", choices=POOLING_TYPES))

    def __post_init__(self):
        if self.dtype not in DTYPES:
            raise ValueError(f"--dtype {self.dtype!r} is not supported; choose one of {', '.join(DTYPES)}")
        if self.cpu_kernels not in CPU_KERNELS:
            raise ValueError(f"--cpu-kernels {self.cpu_kernels!r}: choose one of {', '.join(CPU_KERNELS)}")
        if self.cpu_route not in CPU_ROUTES:
            raise ValueError(f"--cpu-route {self.cpu_route!r}: choose one of {', '.join(CPU_ROUTES)}")
        if self.cpu_route != "auto" and self.dtype not in ("auto", _ROUTE_DTYPES.get(self.cpu_route)):
            fits = _ROUTE_DTYPES.get(self.cpu_route)
            raise ValueError(f"--cpu-route {self.cpu_route} computes in {fits or 'float32 with fp16 weights'}, not "
                             f"--dtype {self.dtype}: leave --dtype auto" + (f" or give {fits}" if fits else ""))
        if self.pooling_type not in POOLING_TYPES:
            raise ValueError(f"--pooling-type {self.pooling_type!r}: choose one of {', '.join(POOLING_TYPES)}")
        if self.max_model_len is not None and self.max_model_len < 1:
            raise ValueError(f"--max-model-len must be at least 1, got {self.max_model_len}")
        if self.max_logprobs < -1:
            raise ValueError(f"--max-logprobs must be -1 (no bound) or 0 or more, got {self.max_logprobs}")


@dataclass(frozen=True)
class CacheConfig:
    block_size: int = field(default=16, metadata=_help("tokens per KV cache block"))
    num_kv_blocks: int | None = field(default=None, metadata=_help(
        "KV cache blocks; default: what the device memory budget leaves"))
    enable_prefix_caching: bool = field(default=True, metadata=_help("reuse KV blocks of shared prompt prefixes"))
    kv_cache_dtype: str = field(default="auto", metadata=_help(
        "KV cache element type: auto (the compute dtype), fp8 / fp8_e4m3 (e4m3 with a K and a V scale per layer; "
        "half of bf16), fp8_e5m2 (wider range, one mantissa bit less)", choices=KV_CACHE_DTYPES))
    calculate_kv_scales: bool = field(default=False, metadata=_help(
        "with an fp8 KV cache, set each layer's K and V scales from the first batch (its largest magnitude over "
        "the fp8 maximum); otherwise the checkpoint's k_scale / v_scale, or 1.0"))

    def __post_init__(self):
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"--kv-cache-dtype {self.kv_cache_dtype!r}: choose one of {', '.join(KV_CACHE_DTYPES)}")
        if self.calculate_kv_scales and self.kv_cache_dtype == "auto":
            raise ValueError("--calculate-kv-scales sets the scales of an fp8 KV cache; add --kv-cache-dtype fp8 "
                             "(or drop --calculate-kv-scales)")
        if self.block_size < 1 or self.block_size & (self.block_size - 1):
            raise ValueError(f"--block-size must be a power of two, got {self.block_size} (16 is the default)")
        if self.num_kv_blocks is not None and self.num_kv_blocks < 1:
            raise ValueError(f"--num-kv-blocks must be at least 1, got {self.num_kv_blocks}")


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int = field(default=256, metadata=_help("most requests running in one step"))
    max_num_batched_tokens: int = field(default=2048, metadata=_help(
        "most tokens computed in one step; long prompts are prefilled in chunks of at most this"))

    def __post_init__(self):
        if self.max_num_seqs < 1:
            raise ValueError(f"--max-num-seqs must be at least 1, got {self.max_num_seqs}")
        if self.max_num_batched_tokens < 1:
            raise ValueError(f"--max-num-batched-tokens must be at least 1, got {self.max_num_batched_tokens}")


@dataclass(frozen=True)
class MemoryConfig:
    device_memory_budget: str | None = field(default=None, metadata=_help(
        "device memory gh200rt may use, e.g. 2GiB; on CPU it stands in for HBM. "
        "Default: free device memory x --gpu-memory-utilization (on CPU: the weights plus up to 2GiB of KV cache)"))
    gpu_memory_utilization: float = field(default=0.9, metadata=_help(
        "fraction of free device memory to use when no budget is given"))
    offload: str = field(default="auto", metadata=_help(
        "where weights live: auto (planner decides; dynamic where the platform makes streaming cheap), none "
        "(all resident), stream, direct, dynamic (layers move between resident and streamed as KV demand changes)",
        choices=OFFLOAD_MODES))
    layer_tiers: str | None = field(default=None, metadata=_help(
        "per-layer override, e.g. 0-3:streamed,7:direct; an MoE layer's routed experts: 0-23:experts=direct"))
    moe_expert_tier: str = field(default="auto", metadata=_help(
        "where an MoE model's routed experts live, each on its own: resident, direct (read in place, only the "
        "experts a step routes to), stream (copied in only when routed to) or auto (the planner decides from the "
        "budget: resident while they fit, then as many resident per layer as fit and the rest direct, or streamed "
        "where the link is slow; with --offload none/stream/direct, experts follow it)", choices=MOE_EXPERT_TIERS))
    staging_slots: int | None = field(default=None, metadata=_help("staging ring depth K; default: planner"))
    prefetch_distance: int | None = field(default=None, metadata=_help(
        "prefetch d streamed layers ahead; default: planner"))
    retier_interval_steps: int = field(default=8, metadata=_help(
        "--offload dynamic: at least this many steps between two tier moves"))
    retier_min_dwell_seconds: float = field(default=2.0, metadata=_help(
        "--offload dynamic: at least this many seconds between two tier moves"))
    retier_max_step_seconds: float | None = field(default=None, metadata=_help(
        "--offload dynamic: a TPOT target: stream no layer that would make a step take longer, and promote "
        "layers back while steps take longer (default: KV demand alone decides)"))
    prefetch_across_steps: bool = field(default=True, metadata=_help(
        "copy the next step's first streamed layers during the tail of this one (off: each step starts its "
        "own copies)"))
    kv_cache_min_tokens: int | None = field(default=None, metadata=_help(
        "KV cache capacity the planner must leave room for, in tokens"))
    host_weight_dtype: str = field(default="auto", metadata=_help(
        "format of offloaded weights in host memory (fp8: e4m3 with a scale per output channel; auto keeps an "
        "FP8 or GGUF checkpoint's own quantized weights and a dense checkpoint's compute dtype, so offloading "
        "never rounds a weight)", choices=HOST_WEIGHT_DTYPES))
    host_weight_cache_dir: str | None = field(default=None, metadata=_help(
        "keep quantized host slabs (--host-weight-dtype int8, int4 or fp8 of a dense checkpoint) in this directory "
        "between runs, keyed by the checkpoint's files and the options: a restart reads them instead of quantizing "
        "again; default: quantize at every start"))
    platform: str | None = field(default=None, metadata=_help(
        "hardware profile for bandwidths (gh200-96g, h100-sxm, ...); default: detected"))
    profile_file: str | None = field(default=None, metadata=_help(
        "measured bandwidth profile (JSON) whose figures replace the built-in table's for the planner: the one "
        "scripts/validate_gpu.py (or scripts/numa_placement.py --profile-out) wrote on this host; default: the "
        "built-in figures of the detected profile (or --platform)"))
    bind_threads: bool = field(default=True, metadata=_help(
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
        if self.host_weight_dtype not in HOST_WEIGHT_DTYPES:
            raise ValueError(f"--host-weight-dtype {self.host_weight_dtype!r}: choose one of "
                             f"{', '.join(HOST_WEIGHT_DTYPES)}")
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
    def tier_overrides(self) -> dict[int, str]:
        return parse_layer_tiers(self.layer_tiers)

    @property
    def expert_tier_overrides(self) -> dict[int, str]:
        """MoE layer -> the tier of all its routed experts (``--layer-tiers L:experts=TIER``)."""
        return parse_layer_tiers(self.layer_tiers, experts=True)


MAX_GRAPH_BATCH = 256


@dataclass(frozen=True)
class GraphConfig:
    enforce_eager: bool | None = field(default=None, metadata=_help(
        "run every step eagerly (no CUDA graphs); default: decode steps replay CUDA graphs on a GPU and run "
        "eagerly on the CPU (--no-enforce-eager runs the CPU through the same bucketed, padded path)"))
    max_graph_batch: int | None = field(default=None, metadata=_help(
        "largest decode batch replayed from a graph (buckets 1, 2, 4, 8, then steps of 8); larger batches run "
        f"eagerly; default: min(--max-num-seqs, {MAX_GRAPH_BATCH})"))
    check_graph_addresses: bool = field(default=False, metadata=_help(
        "debug: before every replay, check that each address the graph saw at capture (input buffers, KV cache, "
        "weights, staging slots) is unchanged"))

    def __post_init__(self):
        if self.max_graph_batch is not None and self.max_graph_batch < 1:
            raise ValueError(f"--max-graph-batch must be at least 1, got {self.max_graph_batch}")


@dataclass(frozen=True)
class ParallelConfig:
    tensor_parallel_size: int = field(default=1, metadata=_help(
        "ranks the model is sharded over (docs/TENSOR_PARALLEL.md): this process and N-1 worker processes on this "
        "host, each holding 1/N of the attention heads, MLP and vocabulary (on the CPU each takes 1/N of the "
        "cores); dense Llama / Mistral / Qwen2 / Qwen3 safetensors checkpoints"))
    nnodes: int = field(default=1, metadata=_help(
        "hosts the ranks run on, tensor-parallel-size / nnodes each (docs/TENSOR_PARALLEL.md: the commands for two "
        "hosts); every host runs the same command with its own --node-rank"))
    node_rank: int = field(default=0, metadata=_help(
        "this host's index among --nnodes: 0 runs rank 0 (the engine and server), the others only run their ranks"))
    master_addr: str = field(default="127.0.0.1", metadata=_help(
        "address of node 0, where the ranks meet (its TCP store); with --nnodes > 1, one the other hosts reach"))
    master_port: int | None = field(default=None, metadata=_help(
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


@dataclass(frozen=True)
class LoRAConfig:
    """LoRA adapters (vLLM's flags; docs/LORA.md). ``lora_modules`` entries are ``name=path`` or vLLM's JSON form
    ``{"name": ..., "path": ..., "base_model_name": ...}``; ``modules`` reads them."""
    enable_lora: bool = field(default=False, metadata=_help(
        "serve LoRA adapters (PEFT directories) beside the base model; a request picks one by its 'model' name"))
    lora_modules: tuple[str, ...] | None = field(default=None, metadata={
        "help": "adapters to load at start: name=path or JSON {\"name\": ..., \"path\": ..., \"base_model_name\": "
                "...}; needs --enable-lora", "nargs": "+"})
    max_loras: int = field(default=1, metadata=_help(
        "adapters in one step: device slots booked in the ledger (requests for further adapters wait)"))
    max_lora_rank: int = field(default=16, metadata=_help("largest adapter rank r accepted (sizes the device slots)"))
    max_cpu_loras: int | None = field(default=None, metadata=_help(
        "adapters whose weights stay in host memory (least recently used ones are read again from disk when "
        "needed); default: --max-loras, and at least --max-loras"))
    enable_runtime_lora_updating: bool = field(default=False, metadata=_help(
        "serve POST /v1/load_lora_adapter and /v1/unload_lora_adapter (vLLM's VLLM_ALLOW_RUNTIME_LORA_UPDATING)"))

    def __post_init__(self):
        if isinstance(self.lora_modules, str):
            object.__setattr__(self, "lora_modules", (self.lora_modules,))
        if self.lora_modules is not None:
            object.__setattr__(self, "lora_modules", tuple(self.lora_modules))
        needs = [flag for flag, given in (("--lora-modules", self.lora_modules),
                                          ("--enable-runtime-lora-updating", self.enable_runtime_lora_updating))
                 if given]
        if needs and not self.enable_lora:
            raise ValueError(f"{' and '.join(needs)} serve LoRA adapters: add --enable-lora")
        if self.max_loras < 1:
            raise ValueError(f"--max-loras must be at least 1, got {self.max_loras}")
        if self.max_lora_rank < 1:
            raise ValueError(f"--max-lora-rank must be at least 1, got {self.max_lora_rank} (vLLM's default is 16)")
        if self.max_cpu_loras is not None and self.max_cpu_loras < self.max_loras:
            raise ValueError(f"--max-cpu-loras ({self.max_cpu_loras}) must be at least --max-loras "
                             f"({self.max_loras}): the adapters of a step are copied from host memory")
        self.modules  # noqa: B018 -- each entry is checked here, once

    @property
    def modules(self):
        """The ``--lora-modules`` entries as ``LoRAModulePath``s (names unique)."""
        from gh200rt.lora.request import parse_lora_modules
        return parse_lora_modules(self.lora_modules or ())

    @property
    def cpu_loras(self) -> int:
        return self.max_cpu_loras or self.max_loras


@dataclass(frozen=True)
class EngineConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    memory: MemoryConfig = field(default_factory=MemoryConfig)
    graphs: GraphConfig = field(default_factory=GraphConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    lora: LoRAConfig = field(default_factory=LoRAConfig)

    def __post_init__(self):
        if self.lora.enable_lora and self.parallel.tensor_parallel_size > 1:
            raise ValueError("--enable-lora runs on one rank: drop --tensor-parallel-size (LoRA with tensor "
                             "parallelism is not supported yet)")
        if self.lora.enable_lora and self.graphs.enforce_eager is False:
            raise ValueError("--enable-lora runs every step eagerly (decode graphs do not hold the per-token adapter "
                             "inputs yet): drop --no-enforce-eager")

    @property
    def max_graph_batch(self) -> int:
        """The largest decode batch a graph holds: ``--max-graph-batch``, at most ``--max-num-seqs``."""
        wanted = self.graphs.max_graph_batch or MAX_GRAPH_BATCH
        return min(wanted, self.scheduler.max_num_seqs)

    def use_graphs(self, device_type: str) -> bool:
        """Decode steps go through the bucketed graph path: on by default on a GPU, off on the CPU."""
        if self.lora.enable_lora:       # decode graphs do not hold the per-token adapter inputs (docs/LORA.md)
            return False
        if self.graphs.enforce_eager is None:
            return device_type == "cuda"
        return not self.graphs.enforce_eager

    @classmethod
    def from_kwargs(cls, **kwargs) -> "EngineConfig":
        """Flat keyword arguments (as ``LLM(...)`` takes them) -> nested config; unknown names raise."""
        parts = {"model": ModelConfig, "cache": CacheConfig, "scheduler": SchedulerConfig, "memory": MemoryConfig,
                 "graphs": GraphConfig, "parallel": ParallelConfig, "lora": LoRAConfig}
        values: dict[str, dict] = {name: {} for name in parts}
        owners = {f: name for name, klass in parts.items() for f in klass.__dataclass_fields__}
        for key, value in kwargs.items():
            if key not in owners:
                raise TypeError(f"unknown engine option {key!r}; known options: {', '.join(sorted(owners))}")
            values[owners[key]][key] = value
        return cls(**{name: klass(**values[name]) for name, klass in parts.items()})
