"""Engine start-up: detect the platform, load the model on the host, plan its tiers, place its weights
and size the KV cache, in that order and once.

The hardware decision is made here (DESIGN.md invariant 1): ``load_and_place(config)`` detects the
platform (unless given one), loads the model on the host, plans per-layer tiers against the
device-memory ledger and hands the model to a ``WeightStore``. The store places the offloaded layers
in host slabs and the fixed weights and staging ring on the device, then asks for the device arena
(``kv/arena.py``): what the ledger has left (or ``--num-kv-blocks`` plus the resident layers) in KV
blocks, of which the resident layers take runs and the KV cache the rest. The returned ``Plan`` is the
one plan: its ``num_kv_blocks`` are the arena's KV blocks at start-up. Over-commit fails here, with
the numbers and the flag to change.
"""
from __future__ import annotations

import dataclasses
import functools
import logging
import os
from dataclasses import dataclass

import torch

from gh200rt.backends import backend_for
from gh200rt.backends.cpu.backend import install_kernels as install_host_kernels
from gh200rt.backends.cpu.prepack import model_route_form_bytes
from gh200rt.config import EngineConfig
from gh200rt.config.speculative import MODEL_METHODS
from gh200rt.engine.decode_graphs import reserve_graph_pool
from gh200rt.kv.arena import DeviceArena
from gh200rt.kv.fp8 import kv_cache_dtype
from gh200rt.kv.pool import arch_kv_bytes_per_block
from gh200rt.loader.load import LoadedModel, load_model
from gh200rt.loader.resolve import resolve_model_path
from gh200rt.lora.install import lora_slot_bytes
from gh200rt.memory.ledger import DeviceMemoryLedger, ledger_capacity
from gh200rt.numa.affinity import bind_engine_threads
from gh200rt.planner.cost_model import activation_bytes, model_sizes
from gh200rt.planner.planner import Plan, RankShare, make_plan
from gh200rt.platform.detect import Platform, detect
from gh200rt.speculative.booking import DraftBooking
from gh200rt.speculative.draft_model import DraftModel, load_draft, load_eagle3_draft, load_mtp_draft
from gh200rt.weights import forms as weight_forms
from gh200rt.weights.device_moves import linear_parts
from gh200rt.weights.expert_cpu import CpuExpertPool
from gh200rt.weights.slab_cache import SlabCache
from gh200rt.weights.slabs import check_node_has_room
from gh200rt.weights.store import WeightStore

log = logging.getLogger(__name__)

DTYPE_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


@dataclass
class PlacedModel:
    loaded: LoadedModel
    platform: Platform
    plan: Plan                  # the one plan: tiers at start-up and the KV blocks booked
    store: WeightStore
    ledger: DeviceMemoryLedger
    device: str
    draft: DraftModel | None = None     # speculative decoding's draft model, resident and booked in the ledger


def max_model_len(config: EngineConfig, arch) -> int:
    """``--max-model-len``, at most the model's context length (its default)."""
    limit = arch.max_position_embeddings
    if config.model.max_model_len is not None and config.model.max_model_len > limit:
        raise ValueError(f"--max-model-len {config.model.max_model_len} exceeds the model's context length {limit}; "
                         f"give at most {limit} (or leave it out)")
    return config.model.max_model_len or limit


def execution_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def load_and_place(config: EngineConfig, platform: Platform | None = None, device: str | None = None,
                   poison: bool = False, shard=None, agree_free=None, agree_draft=None) -> PlacedModel:
    """Load ``config.model`` and place its weights per ``config.memory``; ``poison`` NaN-fills staging
    slots before every copy (tests: a read before the copy lands shows up). ``shard``: a tensor-parallel rank's
    (``distributed.sharding.TensorShard``), whose slice alone is loaded, planned and placed; ``agree_free``: maps
    this rank's free device memory to the smallest any rank has, so that every rank makes the same plan;
    ``agree_draft``: maps this rank's ``DraftBooking`` (rank 0's draft, none on the others) to rank 0's."""
    device = device or execution_device()
    platform = platform or detect(config.memory.platform, config.memory.profile_file)
    # placed below, layer by layer
    # with a quantized host format, a layer's dense linears are read only when the store needs them (not at all
    # for a slab the cache holds)
    defer = config.memory.host_weight_dtype in weight_forms.QUANTIZED_HOST_FORMATS
    loaded = load_model(config.model, device="cpu", compute_device=device, shard=shard, defer_layer_linears=defer)
    arch, dtype = loaded.arch, DTYPE_NAMES[loaded.dtype]
    # free device memory before a draft lands there: the ledger books the draft's weights itself
    free = torch.cuda.mem_get_info()[0] if device == "cuda" else None
    # with tensor parallelism the draft runs unsharded on rank 0 (the whole model's architecture); every rank books it
    draft = speculative_draft(config, loaded.tokenizer, shard.arch if shard is not None else arch, loaded.dtype,
                              device, loaded.model) if shard is None or shard.rank == 0 else None
    fmt = weight_forms.resolve_host_format(config.memory.host_weight_dtype, device == "cpu", loaded.dtype,
                                           bool(loaded.quantized))
    # an FP8 checkpoint's resident layers keep their fp8 weights on a GPU (WeightStore)
    fp8_resident = device != "cpu" and weight_forms.is_fp8_checkpoint(loaded.quantized)
    sizes = model_sizes(arch, dtype, kv_dtype=config.cache.kv_cache_dtype,
                        host_format=weight_forms.planning_format(fmt, loaded.quantized),
                        resident_format="fp8" if fp8_resident else None,
                        vocab_rows=shard.vocab_size if shard is not None else None,
                        fp8_group=weight_forms.fp8_group(loaded.quantized))
    activations = activation_bytes(arch, config.scheduler.step_tokens(device == "cpu"), config.scheduler.max_num_seqs,
                                   dtype)
    if free is not None and agree_free is not None:
        free = agree_free(free)
    longest = max_model_len(config, arch)
    kv_dtype = kv_cache_dtype(config.cache.kv_cache_dtype, loaded.dtype)
    booking = draft.booking(config.cache.block_size, kv_dtype) if draft is not None else DraftBooking()
    if agree_draft is not None and uses_draft(config):
        booking = agree_draft(booking)
    # a draft's KV cache has the pool's blocks: a token of KV costs the target's and the draft's
    per_token = sizes.kv_bytes_per_token + booking.kv_bytes_per_block / config.cache.block_size
    useful_kv = int(config.scheduler.max_num_seqs * longest * per_token)
    if config.cache.num_kv_blocks is not None:     # asked for: the CPU's default budget holds them all
        useful_kv = max(useful_kv, int(config.cache.num_kv_blocks * config.cache.block_size * per_token))
    backend = backend_for(device)
    linear_format = backend.linear_format(loaded.model, loaded.quantized, config)
    # the CPU routes' extra forms beside resident weights: fp32 reordered copies, fp16+gguf blocks (layers of a
    # kind are alike: the first stands for all)
    parts_of = functools.partial(linear_parts, loaded.quantized, arch.tie_word_embeddings)
    first_of_kind = {layer.kind: i for i, layer in reversed(list(enumerate(sizes.layers)))}
    sizes = dataclasses.replace(
        sizes.map_layers(lambda layer: dataclasses.replace(layer, form_bytes=model_route_form_bytes(
            loaded.model, linear_format, [first_of_kind[layer.kind]], False, parts_of))),
        head_form_bytes=model_route_form_bytes(loaded.model, linear_format, [], parts_of=parts_of))
    # a step's working memory beside weights and KV: activations, and on a GPU the decode graphs' pool, which the
    # ledger books before the store; the planner counts both, or the minimum it names would be refused
    lora_bytes = lora_slot_bytes(config.lora, arch, loaded.dtype)
    draft_bytes = booking.weight_bytes
    working = activations + graph_pool_booking(config, arch, dtype, device) + lora_bytes + draft_bytes
    capacity = ledger_capacity(config.memory, free, sizes.all_resident_bytes + working, useful_kv)
    plan = make_plan(sizes, platform, config.memory, capacity, config.cache.block_size,
                     activation_bytes=working, max_model_len=longest,
                     rank_share=RankShare.of(shard.arch, shard.world_size) if shard is not None else None)
    if device != "cpu" and config.memory.bind_threads:
        bind_threads_near(platform.host_numa_node)
    check_node_has_room(plan.host_weight_bytes, platform.host_numa_node)
    ledger = DeviceMemoryLedger(capacity)
    reserve_graph_pool(ledger, config, arch, dtype, device)
    ledger.reserve("lora_slots", lora_bytes)
    ledger.reserve("draft_weights", draft_bytes)
    cache = None
    if config.memory.host_weight_cache_dir and fmt in weight_forms.QUANTIZED_HOST_FORMATS:
        cache = SlabCache(config.memory.host_weight_cache_dir, resolve_model_path(config.model.model), fmt,
                          loaded.dtype, shard=f"{shard.rank}/{shard.world_size}" if shard is not None else "")
    store = WeightStore(loaded.model, device, platform, fmt, poison, ledger, loaded.quantized,
                        cpu_linear_format=linear_format,
                        keep_host_copies=plan.dynamic, prefetch_across_steps=config.memory.prefetch_across_steps,
                        slab_cache=cache, deferred=loaded.deferred,
                        cpu_pool_factory=cpu_expert_pool_factory(config, device),
                        cpu_max_tokens=plan.cpu_expert_max_tokens)
    block_size = config.cache.block_size
    per_block = arch_kv_bytes_per_block(arch, block_size, kv_dtype)
    # a draft model's KV cache has the pool's blocks: each KV block costs both
    draft_per_block = booking.kv_bytes_per_block

    def make_arena(run_bytes: list[int]) -> DeviceArena:
        ledger.reserve("activations", activations)
        runs = sum(max(1, -(-nbytes // per_block)) for nbytes in run_bytes)
        ledger.reserve("arena_weights", runs * per_block)
        kv_blocks = size_kv_pool(ledger, config.cache.num_kv_blocks, per_block + draft_per_block, block_size,
                                 longest)
        ledger.release("arena_weights", runs * per_block)   # the store books each run as it takes it
        ledger.release("kv_pool", kv_blocks * (per_block + draft_per_block))
        ledger.reserve("kv_pool", (kv_blocks + runs) * per_block)
        ledger.reserve("draft_kv", kv_blocks * draft_per_block)
        return DeviceArena(kv_blocks + runs, arch.num_layers, block_size, arch.kv_cache_heads, arch.kv_cache_dim,
                           kv_dtype, device, arch.kv_planes)

    store.apply(plan, make_arena)
    backend.install_kernels(loaded.model, config, device)
    arena = store.arena
    kv_blocks = arena.num_blocks - arena.pool.num_run_blocks
    plan = dataclasses.replace(plan, num_kv_blocks=kv_blocks, arena_weight_blocks=arena.pool.num_run_blocks)
    return PlacedModel(loaded, platform, plan, store, ledger, device, draft)


def cpu_expert_pool_factory(config: EngineConfig, device: str):
    """What makes the cpu expert tier's pool (``--moe-cpu-threads``; checked now, made when an expert takes the tier):
    on a GPU host, by default the CPUs the engine runs on (bound near the GPU) less one for the engine's own thread;
    on the CPU platform, torch's thread count (the same cores as the "device")."""
    available = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    threads = config.memory.moe_cpu_threads
    if threads is not None and threads > available:
        raise ValueError(f"--moe-cpu-threads {threads}: this process may use {available} CPUs"
                         + (" (those of the NUMA node nearest the GPU)" if device != "cpu" and
                            config.memory.bind_threads else "")
                         + f"; give at most {available}")
    if threads is None:
        threads = torch.get_num_threads() if device == "cpu" else max(1, available - 1)

    def make() -> CpuExpertPool:
        log.info("cpu-tier experts computed by %d host threads", threads)
        return CpuExpertPool(threads, functools.partial(install_host_kernels, config=config))
    return make


def uses_draft(config: EngineConfig) -> bool:
    """Whether ``--speculative-config`` names a method that drafts with a model (not from the tokens so far)."""
    method = config.speculative.method
    return method is not None and method.method in MODEL_METHODS


def speculative_draft(config: EngineConfig, tokenizer, arch, dtype: torch.dtype, device: str,
                      model: torch.nn.Module) -> DraftModel | None:
    """The draft of ``--speculative-config`` method draft_model (checked against the target's tokenizer and
    architecture), eagle3 (a head for ``model``) or mtp (the layer the target's checkpoint ships), loaded on
    ``device`` in ``dtype``; None otherwise."""
    if not uses_draft(config):
        return None
    method = config.speculative.method
    if method.method == "eagle3":
        return load_eagle3_draft(method, model, arch, dtype, config, device)
    if method.method == "mtp":
        return load_mtp_draft(method.model or config.model.model, arch, dtype, config, device)
    return load_draft(method, tokenizer, arch, dtype, config, device)


def graph_pool_booking(config: EngineConfig, arch, dtype: str, device: str) -> int:
    """Bytes ``reserve_graph_pool`` books for the decode graphs (0 on the CPU or with graphs off), asked of that
    function itself on a ledger without a limit, so the plan counts exactly what the ledger will hold."""
    unbounded = DeviceMemoryLedger(capacity=1 << 62)
    reserve_graph_pool(unbounded, config, arch, dtype, device)
    return unbounded.by_kind["graph_pools"]


def bind_threads_near(node: int) -> None:
    """Engine and copy threads on the GPU's node, so first-touch memory and copy submission stay local."""
    cpus = bind_engine_threads(node)
    if cpus is None:
        log.warning("not binding threads: NUMA node %d (nearest the GPU) has no CPU this process may use", node)
    else:
        log.info("engine threads bound to the %d CPUs of NUMA node %d", len(cpus), node)


def size_kv_pool(ledger: DeviceMemoryLedger, num_kv_blocks: int | None, bytes_per_block: int, block_size: int,
                 max_model_len: int) -> int:
    """KV blocks: the override, else all the ledger has left; at least one max_model_len sequence must fit."""
    needed = -(-max_model_len // block_size)
    blocks = num_kv_blocks if num_kv_blocks is not None else ledger.free // bytes_per_block
    if blocks < needed:
        source = (f"--num-kv-blocks {num_kv_blocks}" if num_kv_blocks is not None else
                  f"what the device memory budget leaves ({ledger.free / 2**30:.3f} GiB of "
                  f"{ledger.capacity / 2**30:.3f} GiB after weights, staging and activations; "
                  f"{bytes_per_block} bytes per block)")
        raise ValueError(
            f"the KV cache has {blocks} blocks of {block_size} tokens from {source}, but one sequence of "
            f"--max-model-len {max_model_len} needs {needed}; raise --num-kv-blocks or --device-memory-budget, "
            f"offload more layers (--offload stream), or lower --max-model-len")
    ledger.reserve("kv_pool", blocks * bytes_per_block)
    return blocks
