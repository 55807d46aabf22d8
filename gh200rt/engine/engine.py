"""LLMEngine: requests in, incremental ``RequestOutput``s out, one ``step()`` at a time.

Single-threaded by contract (the server drives it from one thread). Each step: schedule ->
run the model on the flattened batch -> advance KV progress -> sample -> detokenize and check
stop conditions -> free finished sequences at once -> report what each request added.

This module wires the engine's parts together (construction, ``from_config``, ``close``). Requests come in through
``RequestIntake`` (request_intake.py: prompts and parameters checked, sequences scheduled, aborts, LoRA adapters);
``EngineSteps`` (stepping.py) runs and reports the steps, launching the next ahead with ``--async-scheduling``;
``EngineReports`` (reports.py) answers ``stats()`` and ``tier_signals()``.
"""
from __future__ import annotations

import functools

import torch

from gh200rt.backends import backend_for
from gh200rt.backends.cpu.host_allocator import keep_freed_memory
from gh200rt.config import EngineConfig
from gh200rt.engine.bootstrap import (DTYPE_NAMES, PlacedModel, load_and_place, max_model_len, size_kv_pool,
                                      speculative_draft)
from gh200rt.engine.decode_graphs import decode_graphs, reserve_graph_pool
from gh200rt.engine.expert_balancer import ExpertBalancer
from gh200rt.engine.host_kv_tier import host_reads, make_host_tier
from gh200rt.engine.layer_times import LayerTimes
from gh200rt.engine.model_runner import ModelRunner
from gh200rt.engine.reports import EngineReports
from gh200rt.engine.request_intake import RequestIntake
from gh200rt.engine.request_state import RequestState
from gh200rt.engine.sampler import Sampler
from gh200rt.engine.stats import EngineStats, iteration_tokens  # noqa: F401  (EngineStats: imported from here too)
from gh200rt.engine.step_cost import StepCostModel
from gh200rt.engine.stepping import EngineSteps, LaunchedStep
from gh200rt.engine.tier_controller import PressurePolicy, TierController
from gh200rt.kv.fp8 import check_device_supports, kv_cache_dtype
from gh200rt.kv.host_blocks import HostKVLayers, device_visible
from gh200rt.kv.kv_manager import HASH_FNS, KVCacheManager
from gh200rt.kv.pool import allocate_arch_kv_caches, arch_kv_bytes_per_block
from gh200rt.lora.install import install_lora, lora_slot_bytes
from gh200rt.memory.ledger import DeviceMemoryLedger, ledger_capacity
from gh200rt.models.layers.attention import configure_kv_scales
from gh200rt.planner.cost_model import copy_seconds
from gh200rt.planner.layout import offloaded_expert_tier
from gh200rt.scheduler.scheduler import Scheduler
from gh200rt.speculative.draft_model import DraftProposer
from gh200rt.speculative.hidden_drafter import HiddenStateProposer
from gh200rt.speculative.speculator import Speculator
from gh200rt.structured import GrammarMatchers
from gh200rt.weights.schedule import NULL_HOOKS
from gh200rt.weights.tiers import Tier


def eos_ids_of(tokenizer) -> frozenset[int]:
    ids = getattr(tokenizer, "eos_token_ids", None)
    if ids is None:
        one = getattr(tokenizer, "eos_token_id", None)
        ids = [] if one is None else [one]
    return frozenset(int(i) for i in ids)


class LLMEngine(RequestIntake, EngineReports, EngineSteps):
    """``placed`` carries the plan, weight store and ledger of a model placed by ``load_and_place``; without
    it (models built by hand, e.g. in tests) every weight counts as resident: ``weight_bytes`` of them."""

    def __init__(self, model: torch.nn.Module, tokenizer, arch, config: EngineConfig, weight_bytes: int = 0,
                 dtype: torch.dtype = torch.float32, device: str = "cpu", placed: PlacedModel | None = None,
                 parallel=None):
        """``parallel``: rank 0's ``distributed.workers.TensorParallelWorkers`` where the model is sharded over
        several ranks (``from_config`` starts them; the engine stops them at ``close``)."""
        if config.model.batch_invariant and torch.device(device).type != "cpu":
            raise ValueError("--batch-invariant covers the CPU routes only: on a GPU, decodes, short chunks and "
                             "prompts take different attention kernels (docs/BENCHMARKS.md, prefix-cache "
                             "invariance); drop the flag")
        self.config = config
        self.tokenizer = tokenizer
        self.arch = arch
        self.vocab_size = arch.vocab_size
        self.max_model_len = max_model_len(config, arch)
        bs = config.cache.block_size
        kv_dtype = kv_cache_dtype(config.cache.kv_cache_dtype, dtype)
        check_device_supports(kv_dtype, device)
        configure_kv_scales(model, config.cache.calculate_kv_scales)
        if placed is None:
            if device == "cpu":  # a placed model got its kernels in load_and_place
                backend_for(device).install_kernels(model, config, device)
            draft = speculative_draft(config, tokenizer, arch, dtype, device, model)
            draft_bytes = draft.weight_bytes if draft is not None else 0
            self.ledger = DeviceMemoryLedger(ledger_capacity(config.memory, None, weight_bytes + draft_bytes))
            self.ledger.reserve("resident_weights", weight_bytes)
            self.ledger.reserve("draft_weights", draft_bytes)
            reserve_graph_pool(self.ledger, config, arch, DTYPE_NAMES[dtype], device)
            self.ledger.reserve("lora_slots", lora_slot_bytes(config.lora, arch, dtype))
            per_block = arch_kv_bytes_per_block(arch, bs, kv_dtype)
            draft_per_block = draft.kv_bytes_per_block(bs, kv_dtype) if draft is not None else 0
            num_blocks = size_kv_pool(self.ledger, config.cache.num_kv_blocks, per_block + draft_per_block, bs,
                                      self.max_model_len)
            self.ledger.release("kv_pool", num_blocks * (per_block + draft_per_block))
            self.ledger.reserve("kv_pool", num_blocks * per_block)
            self.ledger.reserve("draft_kv", num_blocks * draft_per_block)
        else:
            self.ledger = placed.ledger
            num_blocks = placed.plan.num_kv_blocks
            draft = placed.draft
        self.store = placed.store if placed else None
        self.plan = placed.plan if placed else None
        self.platform = placed.platform if placed else None
        arena = self.store.arena if self.store else None
        on_cpu = torch.device(device).type == "cpu"
        # a CPU decode step computes with other kernels than a prefill unless batch-invariant (engine/invariance.py)
        self.kv = KVCacheManager(num_blocks, bs, config.cache.enable_prefix_caching,
                                 hash_fn=HASH_FNS[config.cache.prefix_caching_hash_algo],
                                 pool=arena.pool if arena else None,
                                 publish_decoded_blocks=config.model.batch_invariant or not on_cpu)
        self.lora = install_lora(model, arch, config.lora, dtype, device, self.ledger, getattr(model, "shard", None)) \
            if config.lora.enable_lora else None
        self.scheduler = Scheduler(self.kv, config.scheduler.max_num_seqs, config.scheduler.step_tokens(on_cpu),
                                   config.lora.max_loras if self.lora is not None else None)
        caches = arena.kv_caches() if arena else \
            allocate_arch_kv_caches(arch, num_blocks, bs, kv_dtype, device)
        self.graphs = decode_graphs(model, caches, config, self.max_model_len, device, self.store, self.ledger)
        self.host_tier = make_host_tier(config, caches, device,
                                        self.platform.host_numa_node if self.platform is not None else None,
                                        arena.blocks() if arena else None)
        reads = host_reads(config, caches, device) if self.host_tier is not None else "load"
        if self.host_tier is not None:
            self.kv.attach_host_tier(self.host_tier, config.cache.kv_offloading_write_policy, reads)
        self.parallel = parallel
        if parallel is None:
            make_runner = ModelRunner
        else:
            from gh200rt.distributed.launch import make_runner
            make_runner = functools.partial(make_runner, parallel)
        self.runner = make_runner(model, caches, bs, device, hooks=self.store or NULL_HOOKS, graphs=self.graphs,
                                  batch_invariant=config.model.batch_invariant,
                                  **({"lora": self.lora} if self.lora is not None else {}))
        if self.host_tier is not None:     # blocks found in the host tier reach the device as the step's layers run
            self.runner.host_loads = self.kv.take_host_loads
        if parallel is not None:
            self.runner.host_tier = self.host_tier     # its copies go to the workers with each step
        if reads != "load":
            self.runner.read_host_blocks(HostKVLayers(caches, device_visible(self.host_tier.host, torch.device(device)),
                                                      self.kv.pool.num_blocks))
        if on_cpu:     # activations live in host memory: keep their pages
            keep_freed_memory()
        self.sampler = Sampler(config.model.seed)
        self.eos_token_ids = eos_ids_of(tokenizer)
        self.grammars = GrammarMatchers(tokenizer, arch.vocab_size, self.eos_token_ids)
        self.requests: dict[str, RequestState] = {}
        self._arrivals = 0
        self.controller = None
        memory = config.memory
        # until steps at several splits are timed, a streamed layer is taken to cost its copy
        prior = copy_seconds(placed.plan.sizes.host_layer_bytes, placed.platform) if placed is not None else 0.0
        self.balancer = None
        if placed is not None and placed.plan.dynamic and self.store.expert_tiers:
            self.balancer = ExpertBalancer(self.store, model, config.memory.retier_interval_steps)
        if placed is not None and placed.plan.dynamic:
            self.controller = TierController(self.store, PressurePolicy(
                memory.retier_interval_steps, memory.retier_min_dwell_seconds,
                max_step_seconds=memory.retier_max_step_seconds, costs=StepCostModel(prior)),
                usage=self.balancer.usage if self.balancer else None,
                expert_tier=offloaded_expert_tier(placed.platform))
            if on_cpu:     # the host runs the step: a layer's wall time is its cost
                store = self.store
                self.runner.layer_times = LayerTimes(lambda layer: store.tiers[layer] != Tier.RESIDENT)
        self._steps, self._seen_preemptions, self._step_seconds, self._seen_wait = 0, 0, 0.0, 0.0
        self._seen_preempted_tokens = (0, 0)     # the scheduler's preempted and kept tokens at the last look
        self._step_tokens, self._step_rows = 0, 0
        self._waiting_hashes: dict[str, tuple[int, list[int]]] = {}   # seq id -> (tokens, prompt prefix hashes)
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.iteration_tokens = iteration_tokens()
        spec = config.speculative.method
        proposer = None
        if draft is not None and draft.kind in ("eagle3", "mtp"):
            proposer = HiddenStateProposer(draft.model, num_blocks, bs, kv_dtype, device, self.sampler,
                                           first_host_id=self.kv.pool.num_blocks)
            self.runner.capture(proposer.capture_layers)
        elif draft is not None:
            proposer = DraftProposer(draft, num_blocks, bs, kv_dtype, device, self.sampler)
        self.speculator = Speculator(spec, self.kv, proposer) if spec is not None else None
        # async scheduling runs ahead where every input id of a step is this process's (not rank 0 of a
        # tensor-parallel engine, which sends them from the host) and drafts are not made from the tokens so far
        # (they are on the host once a step is taken in); elsewhere the next step is launched once a step's tokens
        # are taken in, before its report
        asked = config.scheduler.async_scheduling
        overlapping = not on_cpu if asked is None else asked
        self._runs_ahead = overlapping and parallel is None and self.speculator is None
        self._reports_late = overlapping and not self._runs_ahead
        self._in_flight: LaunchedStep | None = None
        self.steps_launched_ahead = 0
        self.rows_discarded = 0

    @classmethod
    def from_config(cls, config: EngineConfig, poison: bool = False, platform=None) -> "LLMEngine":
        """Load, plan and place the model of ``config`` on ``platform`` (default: detected); ``poison``
        NaN-fills staging slots before each copy."""
        if config.parallel.tensor_parallel_size > 1:
            from gh200rt.distributed.launch import start_ranks
            placed, parallel = start_ranks(config, platform, poison)
        else:
            placed, parallel = load_and_place(config, platform, poison=poison), None
        loaded = placed.loaded
        try:
            return cls(loaded.model, loaded.tokenizer, loaded.arch, config, dtype=loaded.dtype, device=placed.device,
                       placed=placed, parallel=parallel)
        except BaseException:
            if parallel is not None:
                parallel.close()
            raise

    def close(self) -> None:
        """Stop the transfer backend's worker, free the host slabs and stop the tensor-parallel workers; the engine
        cannot step afterwards. A step still in flight (its requests aborted) finishes first: it reads the slabs."""
        self._settle_in_flight()
        self._in_flight = None
        if self.parallel is not None:
            self.parallel.close()
        if self.graphs is not None:
            self.graphs.close()
        if self.store is not None:
            self.store.close()
        if self.host_tier is not None:
            self.host_tier.close()

    def check_health(self) -> None:
        """Raise ``EngineDeadError`` where the engine cannot step any more (a tensor-parallel worker died or failed,
        seen without waiting for a step); cheap enough to call while idle."""
        if self.parallel is not None:
            self.parallel.check_health()
