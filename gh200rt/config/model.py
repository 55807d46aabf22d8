"""``ModelConfig``: which model, its compute dtype and CPU route, and what a request may ask of it."""
from __future__ import annotations

from dataclasses import dataclass, field

from gh200rt.config.flags import flag_help

DEFAULT_MODEL = "smollm2-135m"
DTYPES = ("auto", "float32", "bfloat16", "float16")
CPU_KERNELS = ("native", "torch")
CPU_ROUTES = ("auto", "bf16", "fp16", "fp32")  # backends/cpu/routes.py: ROUTES, and auto (detect)
# a forced route computes in one dtype: --dtype may name it or stay auto (fp16 computes in float32 with fp16
# weights, which no --dtype names)
_ROUTE_DTYPES = {"bf16": "bfloat16", "fp32": "float32"}
POOLING_TYPES = ("LAST", "MEAN")  # engine/pooling.py; vLLM's PoolerConfig.pooling_type names
FUSED_DECODE_MAX_ROWS = 64        # kernels/triton/fused_rows.py's MAX_ROWS (triton is an extra: not imported here)


@dataclass(frozen=True)
class ModelConfig:
    model: str = field(default=DEFAULT_MODEL, metadata=flag_help(
        "Hugging Face directory, .gguf file, or alias (smollm2-135m)"))
    dtype: str = field(default="auto", metadata=flag_help(
        "compute dtype; auto = on CPU the fastest accurate route (bfloat16 through oneDNN with AVX-512 BF16 "
        "or AMX, else float32 activations with fp16 linear weights through fbgemm, else float32), on GPU the "
        "checkpoint's dtype; float32 is the exact reference", choices=DTYPES))
    max_model_len: int | None = field(default=None, metadata=flag_help(
        "longest prompt + completion in tokens; default: the model's context length"))
    seed: int = field(default=0, metadata=flag_help("seed for requests that give none"))
    max_logprobs: int = field(default=20, metadata=flag_help(
        "most logprobs a request may ask for per token (logprobs, top_logprobs, prompt_logprobs; -1 in a request "
        "means the whole vocabulary and must fit this bound too); -1 = no bound (vLLM's name and default)"))
    cpu_kernels: str = field(default="native", metadata=flag_help(
        "small ops of a CPU model (RMSNorm, RoPE, KV store, decode attention, SiLU) and its float32 linears of up "
        "to 8 rows: native = C loops built once per machine with the system's C compiler (torch ops where none "
        "is found), torch = torch ops and oneDNN only",
        choices=CPU_KERNELS))
    cpu_route: str = field(default="auto", metadata=flag_help(
        "CPU compute route: auto = detected from the CPU's features (see --dtype auto); bf16 = bf16 weights and "
        "activations through oneDNN; fp16 = float32 activations, fp16 linear weights through fbgemm (and the "
        "native fp16 linear for few rows); fp32 = the exact float32 reference. A forced route must run here "
        "(start-up says why not); ignored on a GPU", choices=CPU_ROUTES))
    batch_invariant: bool = field(default=False, metadata=flag_help(
        "CPU: a request's tokens do not depend on which other requests share its steps (every step's linears in "
        "fixed blocks of rows, decodes too; slower, docs/BENCHMARKS.md); without it only prompt positions are "
        "computed alike however the prompt was split or batched (the prefix cache's guarantee)"))
    fused_decode_rows: int = field(default=1, metadata=flag_help(
        "CUDA: decode steps of up to this many sequences run each dense decoder layer in six Triton launches (the "
        "norms, SiLU-and-mul and residual adds fused into the four products; backends/cuda/decode_layer.py) instead of "
        f"op by op with cuBLAS products; 1-{FUSED_DECODE_MAX_ROWS}, above 1 for bf16/fp16 models (1 = batch 1 "
        "only, its one-row products measured faster than cuBLAS on an H100); ignored on the CPU"))
    enable_pdl: bool | None = field(default=None, metadata=flag_help(
        "CUDA, compute capability 9.0+ (Hopper): the one-call decode layers' Triton kernels use programmatic "
        "dependent launch, so each may be scheduled while the one before it drains (the launch gaps between a "
        "decode step's kernels shrink; kernels/triton/pdl.py); default: on from compute capability 9.0 (1.03-1.08x "
        "at batch 1 on an H200), off below; ignored on the CPU"))
    pooling_type: str = field(default="LAST", metadata=flag_help(
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
        if not 1 <= self.fused_decode_rows <= FUSED_DECODE_MAX_ROWS:
            raise ValueError(f"--fused-decode-rows must be 1-{FUSED_DECODE_MAX_ROWS}, got {self.fused_decode_rows}")
        if self.max_logprobs < -1:
            raise ValueError(f"--max-logprobs must be -1 (no bound) or 0 or more, got {self.max_logprobs}")
