"""``python -m gh200rt.bench kernel <name>``: one kernel or op timed on its own, each figure next to the bound it is
held to (memory or link bandwidth measured in the same run) or to a baseline timed beside it."""
from gh200rt.bench.commands import Command

COMMANDS = {
    "host-gemm": Command("gh200rt.bench.kernel.host_gemm", "GPU: host_gemm at Llama-3-8B's shapes, pinned host "
                                                           "weights against a baseline revision, resident vs cuBLAS"),
    "gemv": Command("gh200rt.bench.kernel.gemv", "GPU: decode's one-row products, gemv per tile against cuBLAS and "
                                                 "host_gemm"),
    "skinny": Command("gh200rt.bench.kernel.skinny", "GPU: few-row products (batch 2-8), the tiled kernel per tile, "
                                                     "stages and K split (--fused: fused_rows)"),
    "gpu-attention": Command("gh200rt.bench.kernel.gpu_attention", "GPU: paged decode attention, split-K against one "
                                                                   "pass, a baseline revision and FlashInfer"),
    "cpu-attention": Command("gh200rt.bench.kernel.cpu_attention", "CPU paged attention per layer call against a "
                                                                   "baseline (padded, torch, another tree's)"),
    "mla-attention": Command("gh200rt.bench.kernel.mla_attention", "CPU latent attention decode: the absorbed form "
                                                                   "against the expanded one (DeepSeek-V3's shape)"),
    "cpu-kernels": Command("gh200rt.bench.kernel.cpu_kernels", "CPU decode step: native ops in one call per layer, "
                                                               "op by op, and torch's ops"),
    "quant-cpu": Command("gh200rt.bench.kernel.quant_cpu", "CPU weight-only matmul at decode shapes: GB/s per host "
                                                           "weight format and route"),
    "quant-load": Command("gh200rt.bench.kernel.quant_load", "host quantization at load per format and thread count "
                                                             "(--engine-start: whole engine starts)"),
    "route-forms": Command("gh200rt.bench.kernel.route_forms", "CPU routes' resident forms at start-up: one by "
                                                               "one and side by side on N threads"),
    "sampler": Command("gh200rt.bench.kernel.sampler", "the sampler's time per step per sampling setting and batch"),
    "reporting": Command("gh200rt.bench.kernel.reporting", "per-step work around the model (detokenize, outputs, "
                                                           "penalties, inputs) at growing output lengths"),
}
