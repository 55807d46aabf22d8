"""Cost model v1: sizes from ArchConfig and a per-layer decode-step time prediction.

Contract: all sizes in bytes, bandwidths in GB/s (1e9 bytes/s), times in seconds. Per layer:
compute = max(weight bytes / HBM bandwidth, 2 x params x batch / peak FLOPs) (a roofline at the
expected batch); a streamed layer's copy = host-format bytes / link bandwidth and hides behind the
compute of the layers between prefetch and use; a direct layer reads its host-format bytes at the
direct-read bandwidth.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from gh200rt.models.arch_config import ArchConfig
from gh200rt.platform.detect import Platform
from gh200rt.weights.tiers import Tier

DTYPE_BYTES = {"fp32": 4, "float32": 4, "bf16": 2, "bfloat16": 2, "fp16": 2, "float16": 2}
FP8_KV_BYTES = {"fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1}  # --kv-cache-dtype values other than auto
INT4_GROUPS = {"int4": 32, "int4-g128": 128}   # columns per scale and minimum (formats/quantizers.py)
SLAB_ALIGN = 64  # every tensor in a host slab starts on a 64-byte boundary (128-bit loads, cache lines)


@dataclass(frozen=True)
class LayerSizes:
    """One decoder layer's linears (a layer kind's: a model that mixes dense and MoE layers has two)."""
    kind: str                # "dense" or "moe"
    params: int              # linears and norms a token multiplies (for FLOPs; an MoE layer's k routed experts,
                             # not all)
    resident_bytes: int      # linear weights as resident (compute dtype, or an FP8 checkpoint's fp8)
    host_bytes: int          # linear weights in the host format (its slab; a staging slot holds the largest)
    # of host_bytes, what a quantized host format's scales (and int4 minimums) take: a DIRECT layer keeps them in
    # device memory when the plan says so (--direct-scales device), and only the codes cross the link
    host_scale_bytes: int = 0
    # what the CPU routes' resident forms hold beside those bytes (the fp32 routes' reordered copies, the fp16+gguf
    # route's GGUF blocks): memory, not bytes read per step
    form_bytes: int = 0
    # a resident layer's run of the device arena: resident_bytes rounded up to whole KV blocks (planning_sizes
    # sets it; 0: resident_bytes)
    run_bytes: int = 0

    @property
    def resident_memory(self) -> int:
        """The layer resident: its arena run, its route form's copies included."""
        return max(self.resident_bytes, self.run_bytes) + self.form_bytes


@dataclass(frozen=True)
class ModelSizes:
    layers: tuple[LayerSizes, ...]   # per decoder layer (layers of one kind share one LayerSizes)
    fixed_bytes: int         # always on the device: embedding, lm_head (once if tied), norms, biases, RoPE tables,
                             # KV cache scales
    head_bytes: int          # the lm_head matrix, read every step
    kv_bytes_per_token: int  # all layers, K and V (latent attention: its one latent row)
    head_form_bytes: int = 0  # the CPU routes' forms of the LM head beside it
    # an MoE model's routed experts, placed one by one apart from their layers (the layer sizes leave them out)
    moe_layer_ids: tuple[int, ...] = ()   # decoder layers with routed experts
    num_experts: int = 0         # routed experts per MoE layer
    experts_per_tok: int = 0     # k: experts each token routes to
    expert_bytes: int = 0        # one expert's linears as resident
    host_expert_bytes: int = 0   # one expert's span in the host format (expert slab stride, staging slot)
    expert_form_bytes: int = 0   # a resident expert's CPU route form copies
    expert_params: int = 0       # one routed expert's weights (its gate, up and down projections)

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    # the largest layer's figures: what one staging slot or arena window must hold, and a uniform model's layer
    @property
    def layer_bytes(self) -> int:
        return max(layer.resident_bytes for layer in self.layers)

    @property
    def layer_params(self) -> int:
        return max(layer.params for layer in self.layers)

    @property
    def host_layer_bytes(self) -> int:
        return max(layer.host_bytes for layer in self.layers)

    @property
    def host_scale_bytes(self) -> int:
        return max(layer.host_scale_bytes for layer in self.layers)

    @property
    def resident_layer_memory(self) -> int:
        return max(layer.resident_memory for layer in self.layers)

    @property
    def kinds(self) -> dict[str, LayerSizes]:
        """Each layer kind's sizes, in the order the kinds first appear."""
        return {layer.kind: layer for layer in self.layers}

    def resident_memory(self, layers=None) -> int:
        """Device memory of ``layers`` (default: all) resident."""
        return sum(self.layers[i].resident_memory for i in (range(self.num_layers) if layers is None else layers))

    def host_bytes(self, layers=None) -> int:
        """Host slab bytes of ``layers`` (default: all)."""
        return sum(self.layers[i].host_bytes for i in (range(self.num_layers) if layers is None else layers))

    def slot_bytes(self, layers) -> int:
        """A staging slot that holds any of ``layers`` (0: none)."""
        return max((self.layers[i].host_bytes for i in layers), default=0)

    def map_layers(self, change) -> "ModelSizes":
        """These sizes with each kind's LayerSizes replaced by ``change(layer_sizes)`` (layers of a kind stay one)."""
        changed = {kind: change(layer) for kind, layer in self.kinds.items()}
        return dataclasses.replace(self, layers=tuple(changed[layer.kind] for layer in self.layers))

    @property
    def resident_expert_memory(self) -> int:
        return self.expert_bytes + self.expert_form_bytes

    @property
    def all_experts(self) -> int:
        return len(self.moe_layer_ids) * self.num_experts

    @property
    def fixed_memory(self) -> int:
        return self.fixed_bytes + self.head_form_bytes

    @property
    def all_resident_bytes(self) -> int:
        return self.fixed_memory + self.resident_memory() + self.all_experts * self.resident_expert_memory


def expected_distinct_experts(num_experts: int, top_k: int, tokens: int) -> float:
    """Experts a step of ``tokens`` tokens touches in one MoE layer when each token picks ``top_k`` of
    ``num_experts`` uniformly: ``E * (1 - (1 - k/E)^T)`` (k at one token, every expert in a large batch)."""
    if not num_experts:
        return 0.0
    return num_experts * (1.0 - (1.0 - top_k / num_experts) ** tokens)


def layer_kind(arch: ArchConfig, layer: int) -> str:
    """``moe`` for a decoder layer with routed experts, else ``dense``."""
    return "moe" if arch.is_moe and arch.is_moe_layer(layer) else "dense"


def layer_linear_shapes(arch: ArchConfig, kind: str = "dense", active: bool = False) -> list[tuple[int, int]]:
    """[out, in] of the fused linears a decoder layer of ``kind`` has under its tier, in the order of its
    WeightRefs (a slab's layout): qkv, o (latent attention: q_a, q_b, kv_a, kv_b, o), then a dense MLP's gate_up
    and down, or an MoE layer's router and the shared expert's gate_up, down and gate. Routed experts are placed on
    their own (``expert_linear_shapes``). ``active``: the linears one token multiplies, the k routed experts it picks
    included (for FLOPs)."""
    h = arch.hidden_size
    attention = latent_attention_shapes(arch) if arch.is_mla else [(arch.q_size + 2 * arch.kv_size, h),
                                                                    (h, arch.q_size)]
    if kind == "dense":
        return attention + [(2 * arch.intermediate_size, h), (h, arch.intermediate_size)]
    assert kind == "moe" and arch.is_moe, kind
    return attention + _sparse_mlp_shapes(arch) + (expert_linear_shapes(arch) * arch.num_experts_per_tok
                                                   if active else [])


def latent_attention_shapes(arch: ArchConfig) -> list[tuple[int, int]]:
    """A latent attention layer's linears (models/layers/mla.py), in its WeightRefs' order."""
    h, heads, rank, rope = arch.hidden_size, arch.num_heads, arch.kv_lora_rank, arch.head_dim
    q_in = arch.q_lora_rank or h
    return ([(arch.q_lora_rank, h)] if arch.q_lora_rank else []) + [
        (heads * (arch.qk_nope_head_dim + rope), q_in), (rank + rope, h),
        (heads * (arch.qk_nope_head_dim + arch.v_head_dim), rank), (h, heads * arch.v_head_dim)]


def attention_activation_width(arch: ArchConfig) -> int:
    """Values per token an attention layer holds at once: q, k, v; latent attention's query, latent row, absorbed
    query and output (both ``kv_lora_rank + rope`` wide per head) and values."""
    if not arch.is_mla:
        return arch.q_size + 2 * arch.kv_size
    heads, latent = arch.num_heads, arch.kv_cache_dim
    return heads * (arch.qk_nope_head_dim + arch.head_dim) + latent + 2 * heads * latent + heads * arch.v_head_dim


def _sparse_mlp_shapes(arch: ArchConfig) -> list[tuple[int, int]]:
    """An MoE layer's MLP linears besides its routed experts: the router and the shared expert (Qwen2-MoE's with
    its gate)."""
    h, shared = arch.hidden_size, arch.shared_expert_intermediate_size
    gate = [(1, h)] if arch.architecture == "qwen2_moe" else []
    return [(arch.num_experts, h)] + ([(2 * shared, h), (h, shared)] + gate if shared else [])


def expert_linear_shapes(arch: ArchConfig) -> list[tuple[int, int]]:
    """One routed expert's fused gate_up and down (an expert slab's period)."""
    h, i = arch.hidden_size, arch.moe_intermediate_size
    return [(2 * i, h), (h, i)]


def mlp_activation_width(arch: ArchConfig) -> int:
    """Values per token the widest MLP holds at once: gate_up and its activation of a dense layer; of an MoE
    layer, each of the k routed copies' (plus their outputs), the shared expert's and the router logits."""
    dense = 3 * arch.intermediate_size
    if not arch.is_moe:
        return dense
    sparse = arch.num_experts_per_tok * (3 * arch.moe_intermediate_size + arch.hidden_size) \
        + 3 * arch.shared_expert_intermediate_size + arch.num_experts
    return max(dense, sparse)


def host_weight_parts(fmt: str, shape: tuple[int, int], fp8_group: int | None = None) -> list[int]:
    """Bytes of each stored part of one ``[N, K]`` weight in ``fmt``: a dense dtype (one part), ``int8`` or
    ``fp8`` (one byte per weight, float32 scale per output channel; a block-FP8 checkpoint's fp8 a scale per row and
    ``fp8_group`` columns) or ``int4`` (packed nibbles, float32 scale and minimum per group of 32 columns)."""
    n, k = shape
    if fmt in DTYPE_BYTES:
        return [n * k * DTYPE_BYTES[fmt]]
    if fmt == "fp8" and fp8_group:
        return [n * k, 4 * n * -(-k // fp8_group)]
    if fmt in ("int8", "fp8"):
        return [n * k, 4 * n]
    if fmt in INT4_GROUPS:
        groups = -(-k // INT4_GROUPS[fmt])
        return [n * ((k + 1) // 2), 4 * n * groups, 4 * n * groups]
    raise ValueError(f"unknown host weight format {fmt!r}; choose a dtype, int8, int4, int4-g128 or fp8")


def aligned_total(part_bytes: list[int]) -> int:
    """Slab size of parts laid out back to back, each starting on a SLAB_ALIGN boundary."""
    offset = 0
    for nbytes in part_bytes:
        offset = -(-offset // SLAB_ALIGN) * SLAB_ALIGN + nbytes
    return offset


def model_sizes(arch: ArchConfig, dtype: str = "bf16", kv_dtype: str | None = None,
                host_format: str | None = None, resident_format: str | None = None,
                vocab_rows: int | None = None, fp8_group: int | None = None) -> ModelSizes:
    """``kv_dtype``: a ``--kv-cache-dtype`` value (``auto``/None: ``dtype``); ``host_format``: how offloaded
    layers are stored (a dtype name, ``int8``, ``int4`` or ``fp8``); ``resident_format``: how resident layers'
    linears are held (``fp8`` for an FP8 checkpoint on a GPU); both default to ``dtype``. ``vocab_rows``: the
    rows of the embedding and LM head held (a tensor-parallel rank's ``arch`` is its local one and it holds
    1/N of the vocabulary; default: all of it). ``fp8_group``: a block-FP8 checkpoint's block columns (its fp8
    weights carry a scale per row and block)."""
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"--dtype {dtype!r}: choose one of {', '.join(DTYPE_BYTES)}")
    kv_dtype = dtype if kv_dtype in (None, "auto") else kv_dtype
    if kv_dtype not in DTYPE_BYTES and kv_dtype not in FP8_KV_BYTES:
        raise ValueError(f"--kv-cache-dtype {kv_dtype!r}: choose auto or one of {', '.join(FP8_KV_BYTES)}")
    wb, kvb = DTYPE_BYTES[dtype], {**DTYPE_BYTES, **FP8_KV_BYTES}[kv_dtype]
    # norms, qkv bias, q/k norms (latent attention: its q_a and kv_a norms): stay on the device
    layer_small = 2 * arch.hidden_size + (arch.q_size + 2 * arch.kv_size if arch.attention_bias and not arch.is_mla
                                          else 0) \
        + (2 * arch.head_dim if arch.qk_norm else 0) + (arch.q_lora_rank + arch.kv_lora_rank if arch.is_mla else 0)
    head = (arch.vocab_size if vocab_rows is None else vocab_rows) * arch.hidden_size
    embeds = head * (1 if arch.tie_word_embeddings else 2) + arch.hidden_size
    rope_tables = 2 * arch.max_position_embeddings * (arch.rope_dim // 2) * 4  # float32 cos and sin
    kv_scales = arch.num_layers * 2 * 4  # float32 K and V scale per layer (kv/fp8.py)
    # a sigmoid router's float32 score correction per routed expert (models/moe.py)
    correction = len(arch.moe_layers) * arch.num_experts * 4 if arch.is_moe and arch.scoring_func == "sigmoid" else 0
    fixed = (embeds + arch.num_layers * layer_small) * wb + rope_tables + kv_scales + correction

    def host_parts(shape):
        return host_weight_parts(host_format or dtype, shape, fp8_group)

    def resident_parts(shape):
        return host_weight_parts(resident_format or dtype, shape, fp8_group)

    def kind_sizes(kind: str) -> LayerSizes:
        shapes = layer_linear_shapes(arch, kind)
        return LayerSizes(
            kind, sum(n * k for n, k in layer_linear_shapes(arch, kind, active=True)) + layer_small,
            aligned_total([part for shape in shapes for part in resident_parts(shape)]),
            aligned_total([part for shape in shapes for part in host_parts(shape)]),
            host_scale_bytes=sum(sum(host_parts(shape)[1:]) for shape in shapes))
    kinds = [layer_kind(arch, i) for i in range(arch.num_layers)]
    of_kind = {kind: kind_sizes(kind) for kind in kinds}
    experts = {}
    if arch.is_moe:
        expert = expert_linear_shapes(arch)
        experts = dict(moe_layer_ids=tuple(arch.moe_layers), num_experts=arch.num_experts,
                       experts_per_tok=arch.num_experts_per_tok,
                       expert_bytes=_expert_span([p for s in expert for p in resident_parts(s)]),
                       host_expert_bytes=_expert_span([p for s in expert for p in host_parts(s)]),
                       expert_params=sum(n * k for n, k in expert))
    return ModelSizes(tuple(of_kind[kind] for kind in kinds), fixed, head * wb,
                      arch.kv_planes * arch.kv_cache_heads * arch.kv_cache_dim * kvb * arch.num_layers, **experts)


def _expert_span(part_bytes: list[int]) -> int:
    """One expert's period in an expert slab: its parts, then up to the next 64-byte boundary."""
    return -(-aligned_total(part_bytes) // SLAB_ALIGN) * SLAB_ALIGN


def activation_bytes(arch: ArchConfig, max_num_batched_tokens: int, max_num_seqs: int, dtype: str) -> int:
    """Peak working memory of one step: the widest per-token intermediates (hidden, qkv, gate_up, attention
    output, residual) for every batched token, plus float32 logits for every sampled row."""
    wb = DTYPE_BYTES[dtype]
    per_token = (3 * arch.hidden_size + attention_activation_width(arch) + mlp_activation_width(arch)) * wb
    return max_num_batched_tokens * per_token + max_num_seqs * arch.vocab_size * 4


# torch's caching allocator hands a graph's private pool whole segments: 2 MiB ones for blocks of at most 1 MiB and
# 20 MiB ones for blocks of 1-10 MiB (c10/cuda/CUDACachingAllocator.cpp: kSmallBuffer, kLargeBuffer), so a capture
# whose intermediates reach a few MiB takes at least one of each: the 8B shape's batch-24 graph needed 21 MiB on an
# H200 against 3.7 MiB of tensors, and ran eagerly once the KV cache had the rest (docs/gpu-runs/h200-2026-11-29).
POOL_SMALL_SEGMENT = 2 << 20
POOL_LARGE_SEGMENT = 20 << 20


def graph_pool_bytes(arch: ArchConfig, buckets: list[int], dtype: str) -> int:
    """Device memory the decode graphs' shared pool needs: the largest bucket's step intermediates (the pool
    reuses them across captures) plus every graph's output, which stays allocated (logits are outside), in the
    allocator's segments."""
    wb = DTYPE_BYTES[dtype]
    per_token = (3 * arch.hidden_size + attention_activation_width(arch) + mlp_activation_width(arch)) * wb
    tensors = max(buckets) * per_token + sum(buckets) * arch.hidden_size * wb
    return -(-tensors // POOL_SMALL_SEGMENT) * POOL_SMALL_SEGMENT + POOL_LARGE_SEGMENT + POOL_SMALL_SEGMENT


def layer_compute_seconds(layer: LayerSizes, platform: Platform, batch: int, weight_bytes: int | None = None) -> float:
    """``weight_bytes``: what the layer's GEMMs read from HBM (default: the resident form)."""
    memory_s = (layer.resident_bytes if weight_bytes is None else weight_bytes) / (platform.hbm_gbps * 1e9)
    flops_s = 2.0 * layer.params * batch / (platform.peak_tflops * 1e12)
    return max(memory_s, flops_s)


def copy_seconds(nbytes: int, platform: Platform) -> float:
    return nbytes / (platform.link_h2d_gbps * 1e9)


def direct_read_seconds(nbytes: int, platform: Platform) -> float:
    return nbytes / (platform.direct_read_gbps * 1e9)


def direct_layer_seconds(layer: LayerSizes, platform: Platform, scales_on_device: bool = False) -> float:
    """A DIRECT layer's weights read in place: its host form over the link, or with its scales in device memory
    (``scales_on_device``) only the codes over the link and the scales from HBM."""
    if not scales_on_device:
        return direct_read_seconds(layer.host_bytes, platform)
    return direct_read_seconds(layer.host_bytes - layer.host_scale_bytes, platform) + \
        layer.host_scale_bytes / (platform.hbm_gbps * 1e9)


# host_gemm (kernels/triton/host_gemm.py) reads a weight once per M-tile of at most this many rows.
HOST_GEMM_ROWS_PER_READ = 64


# The link must carry at least this share of HBM bandwidth for tiers to follow KV demand by default
# (GH200's NVLink-C2C: ~0.1 of HBM3; PCIe Gen5 x16 on an H100: ~0.016).
CHEAP_STREAMING_LINK_SHARE = 0.05


def streaming_is_cheap(platform: Platform) -> bool:
    """Whether ``--offload auto`` means dynamic tiers: a GPU whose host link is fast next to its HBM."""
    return platform.kind != "cpu" and platform.link_h2d_gbps >= CHEAP_STREAMING_LINK_SHARE * platform.hbm_gbps


def direct_staging_min_tokens(platform: Platform) -> int | None:
    """Smallest step, in tokens, from which a DIRECT layer is better copied into a staging slot once
    (then read from HBM) than read in place by host_gemm, which crosses the link once per 64 rows.

    Staging starts once host_gemm would read the weight at least twice and those reads cost more
    than one copy; below that the direct tier keeps its point (no HBM, no copy). None on the cpu
    platform, where compute reads host memory directly and nothing crosses a link."""
    if platform.kind == "cpu":
        return None
    reads = 2
    while reads / platform.direct_read_gbps <= 1 / platform.link_h2d_gbps:
        reads += 1
    return (reads - 1) * HOST_GEMM_ROWS_PER_READ + 1


def cpu_expert_seconds(sizes: ModelSizes, platform: Platform, tokens: float) -> float:
    """A routed expert computed on the host's cores for ``tokens`` (token, choice) pairs: its host form read once,
    or the pairs' arithmetic, whichever bounds (``host_cpu_gbps``, ``host_cpu_tflops``)."""
    return max(sizes.host_expert_bytes / (platform.host_cpu_gbps * 1e9),
               2.0 * sizes.expert_params * tokens / (platform.host_cpu_tflops * 1e12))


def device_expert_seconds(sizes: ModelSizes, platform: Platform) -> float:
    """An offloaded expert computed on the device, whatever its tokens: read in place where the link is fast next to
    HBM (GH200; the CPU platform), else copied in and read from HBM (its copy waits for the router)."""
    if platform.kind == "cpu" or streaming_is_cheap(platform):
        return direct_read_seconds(sizes.host_expert_bytes, platform)
    return copy_seconds(sizes.host_expert_bytes, platform) + sizes.host_expert_bytes / (platform.hbm_gbps * 1e9)


def cpu_expert_max_tokens(sizes: ModelSizes, platform: Platform) -> int | None:
    """Fiddler's rule for this hardware: the most pairs a step may route to a cpu-tier expert for the host's cores
    to compute it no slower than the device would (the device's cost is flat in tokens, the cores' grows with them);
    0 where the device is faster even for one. None on the CPU platform, whose cores are the device."""
    if platform.kind == "cpu":
        return None
    device = device_expert_seconds(sizes, platform)
    if sizes.expert_params == 0 or cpu_expert_seconds(sizes, platform, 1) > device:
        return 0
    return int(device * platform.host_cpu_tflops * 1e12 / (2.0 * sizes.expert_params))


def expert_seconds(expert_tiers, sizes: ModelSizes, platform: Platform, batch: int) -> float:
    """The routed experts' part of a decode step of ``batch`` tokens: in each MoE layer the expected distinct
    experts it touches, each read from HBM (resident), in place over the link (direct), copied in first and
    then read (streamed; its copy waits for the router, so nothing hides it), or by the host's cores (cpu: at the
    cheaper of the cores, for the tokens each touched expert gets, and the device; the cores' time overlaps the
    device's own experts, counted here as if not)."""
    seconds = 0.0
    for layer in expert_tiers or ():
        if not layer:
            continue
        distinct = expected_distinct_experts(len(layer), sizes.experts_per_tok, batch)
        touched = distinct / len(layer)
        per_expert = batch * sizes.experts_per_tok / max(distinct, 1e-9)
        resident, streamed = layer.count(Tier.RESIDENT), layer.count(Tier.STREAMED)
        cpu = layer.count(Tier.CPU)
        direct = len(layer) - resident - streamed - cpu
        seconds += touched * (resident * sizes.expert_bytes / (platform.hbm_gbps * 1e9)
                              + cpu * min(cpu_expert_seconds(sizes, platform, per_expert),
                                          device_expert_seconds(sizes, platform))
                              + direct * direct_read_seconds(sizes.host_expert_bytes, platform)
                              + streamed * (copy_seconds(sizes.host_expert_bytes, platform)
                                            + sizes.host_expert_bytes / (platform.hbm_gbps * 1e9)))
    return seconds


def predict_step_seconds(tiers: list[str], sizes: ModelSizes, platform: Platform, batch: int,
                         prefetch_distance: int = 1, expert_tiers=None, direct_scales_on_device: bool = False) -> float:
    """Decode step time: each streamed copy overlaps the compute of the ``prefetch_distance``
    layers before its use; the copy engine serialises copies, so the step is bounded below by
    the total copy time too. ``expert_tiers`` (per layer, a tier per routed expert): ``expert_seconds``;
    ``direct_scales_on_device``: ``direct_layer_seconds``."""
    def seconds(layer: LayerSizes, tier: str) -> float:
        # a streamed layer computes from its staging slot, which holds the host form (fp8 / int8 / int4: fewer bytes)
        if tier == Tier.STREAMED:
            return layer_compute_seconds(layer, platform, batch, layer.host_bytes)
        if tier == Tier.DIRECT:
            return direct_layer_seconds(layer, platform, direct_scales_on_device)
        return layer_compute_seconds(layer, platform, batch)
    per_layer = [seconds(layer, Tier(tier)) for layer, tier in zip(sizes.layers, tiers, strict=True)]
    total = sum(per_layer)
    stall = 0.0
    for idx, tier in enumerate(tiers):
        if tier == Tier.STREAMED:
            hidden = sum(per_layer[max(0, idx - prefetch_distance):idx])
            stall += max(0.0, copy_seconds(sizes.layers[idx].host_bytes, platform) - hidden)
    copies = sum(copy_seconds(sizes.layers[i].host_bytes, platform) for i, t in enumerate(tiers) if t == Tier.STREAMED)
    head = sizes.head_bytes / (platform.hbm_gbps * 1e9)
    return max(total + stall, copies) + head + expert_seconds(expert_tiers, sizes, platform, batch)
