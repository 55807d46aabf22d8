"""LLMEngine: requests in, incremental ``RequestOutput``s out, one ``step()`` at a time.

Single-threaded by contract (the server drives it from one thread). Each step: schedule ->
run the model on the flattened batch -> advance KV progress -> sample -> detokenize and check
stop conditions -> free finished sequences at once -> report what each request added. An embedding
request (``PoolingParams``) is prefilled in the same steps and answered once, pooled (engine/pooling.py).
"""
from __future__ import annotations

import functools
import time

import torch

from gh200rt.config import EngineConfig
from gh200rt.engine.cuda_graphs import decode_graphs, reserve_graph_pool
from gh200rt.engine.detokenizer import IncrementalDetokenizer
from gh200rt.engine.expert_balancer import ExpertBalancer
from gh200rt.engine.host_allocator import keep_freed_memory
from gh200rt.engine.model_runner import ModelRunner
from gh200rt.engine.outputs import EmbeddingRequestOutput, RequestOutput
from gh200rt.engine.pooling import EmbeddingState
from gh200rt.engine.request_state import RequestState, prompt_logprobs_for_chunk
from gh200rt.engine.sampler import Sampler
from gh200rt.engine.stats import EngineStats, adapter_names, iteration_tokens  # noqa: F401  (EngineStats: imported from here too)
from gh200rt.engine.step_cost import StepCostModel
from gh200rt.engine.tier_controller import PressurePolicy, TierController, TierSignals
from gh200rt.planner.layout import offloaded_expert_tier
from gh200rt.kv.fp8 import check_device_supports, configure_kv_scales, kv_cache_dtype
from gh200rt.kv.kv_manager import KVCacheManager, salt_of
from gh200rt.engine.bootstrap import (DTYPE_NAMES, PlacedModel, install_kernels, load_and_place, max_model_len,
                                     size_kv_pool)
from gh200rt.kv.pool import allocate_kv_caches, kv_bytes_per_block
from gh200rt.lora.install import install_lora, lora_slot_bytes
from gh200rt.lora.request import LoRARequest
from gh200rt.planner.cost_model import copy_seconds
from gh200rt.memory.ledger import DeviceMemoryLedger, ledger_capacity
from gh200rt.pooling_params import PoolingParams
from gh200rt.sampling_params import SamplingParams
from gh200rt.scheduler.request import Sequence
from gh200rt.scheduler.scheduler import Scheduler
from gh200rt.structured import GrammarMatchers
from gh200rt.weights.schedule import NULL_HOOKS


def eos_ids_of(tokenizer) -> frozenset[int]:
    ids = getattr(tokenizer, "eos_token_ids", None)
    if ids is None:
        one = getattr(tokenizer, "eos_token_id", None)
        ids = [] if one is None else [one]
    return frozenset(int(i) for i in ids)


class LLMEngine:
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
                install_kernels(model, config, device)
            self.ledger = DeviceMemoryLedger(ledger_capacity(config.memory, None, weight_bytes))
            self.ledger.reserve("resident_weights", weight_bytes)
            reserve_graph_pool(self.ledger, config, arch, DTYPE_NAMES[dtype], device)
            self.ledger.reserve("lora_slots", lora_slot_bytes(config.lora, arch, dtype))
            per_block = kv_bytes_per_block(arch.num_layers, bs, arch.num_kv_heads, arch.head_dim, kv_dtype)
            num_blocks = size_kv_pool(self.ledger, config.cache.num_kv_blocks, per_block, bs, self.max_model_len)
        else:
            self.ledger = placed.ledger
            num_blocks = placed.plan.num_kv_blocks
        self.store = placed.store if placed else None
        self.plan = placed.plan if placed else None
        self.platform = placed.platform if placed else None
        arena = self.store.arena if self.store else None
        on_cpu = torch.device(device).type == "cpu"
        # a CPU decode step computes with other kernels than a prefill unless batch-invariant (engine/invariance.py)
        self.kv = KVCacheManager(num_blocks, bs, config.cache.enable_prefix_caching,
                                 pool=arena.pool if arena else None,
                                 publish_decoded_blocks=config.model.batch_invariant or not on_cpu)
        self.lora = install_lora(model, arch, config.lora, dtype, device, self.ledger) \
            if config.lora.enable_lora else None
        self.scheduler = Scheduler(self.kv, config.scheduler.max_num_seqs, config.scheduler.max_num_batched_tokens,
                                   config.lora.max_loras if self.lora is not None else None)
        caches = arena.kv_caches() if arena else \
            allocate_kv_caches(arch.num_layers, num_blocks, bs, arch.num_kv_heads, arch.head_dim, kv_dtype, device)
        self.graphs = decode_graphs(model, caches, config, self.max_model_len, device, self.store, self.ledger)
        self.parallel = parallel
        if parallel is None:
            make_runner = ModelRunner
        else:
            from gh200rt.distributed.launch import make_runner
            make_runner = functools.partial(make_runner, parallel)
        self.runner = make_runner(model, caches, bs, device, hooks=self.store or NULL_HOOKS, graphs=self.graphs,
                                  batch_invariant=config.model.batch_invariant,
                                  **({"lora": self.lora} if self.lora is not None else {}))
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
        self._steps, self._seen_preemptions, self._step_seconds, self._seen_wait = 0, 0, 0.0, 0.0
        self._step_tokens, self._step_rows = 0, 0
        self._waiting_hashes: dict[str, tuple[int, list[int]]] = {}   # seq id -> (tokens, prompt prefix hashes)
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.iteration_tokens = iteration_tokens()

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
        cannot step afterwards."""
        if self.parallel is not None:
            self.parallel.close()
        if self.graphs is not None:
            self.graphs.close()
        if self.store is not None:
            self.store.close()

    def check_health(self) -> None:
        """Raise ``EngineDeadError`` where the engine cannot step any more (a tensor-parallel worker died or failed,
        seen without waiting for a step); cheap enough to call while idle."""
        if self.parallel is not None:
            self.parallel.check_health()

    # ---- requests -------------------------------------------------------------------------------
    def add_request(self, request_id: str, prompt: str | None, params: SamplingParams | PoolingParams | None = None,
                    prompt_token_ids: list[int] | None = None, lora_request: LoRARequest | str | None = None,
                    cache_salt: str | None = None) -> None:
        """A generation request, or with ``PoolingParams`` an embedding request (vLLM's convention).
        ``lora_request``: the adapter to run under (a loaded adapter's name, or vLLM's ``LoRARequest``, whose
        path is loaded under its name first if the name is new); None: the base model. ``cache_salt`` (vLLM's):
        the request shares prefix-cache blocks only with requests of the same salt (and adapter)."""
        params = params or SamplingParams()
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already running; use a unique id")
        adapter = self._adapter_for(lora_request) if lora_request is not None else None
        prompt_token_ids = self._prompt_ids(prompt, prompt_token_ids)
        if isinstance(params, PoolingParams):
            if cache_salt is not None:
                raise ValueError("embedding requests take no cache_salt; leave it out")
            if adapter is not None:
                raise ValueError("embeddings under a LoRA adapter are not supported; ask the base model for them")
            return self._add_embedding(request_id, prompt_token_ids, params)
        params = params.with_vocab(self.vocab_size).with_tokenizer(
            lambda text: self.tokenizer.encode(text, add_special_tokens=False))
        self._validate(prompt_token_ids, params)
        state = RequestState(request_id, prompt, prompt_token_ids, params)
        grammars = [self.grammars.new(params.structured_output) for _ in range(params.n)] \
            if params.structured_output is not None else [None] * params.n
        owner = None
        for index in range(params.n):
            seq = Sequence(f"{request_id}#{index}", request_id, index, prompt_token_ids, params, self._arrivals,
                           self.eos_token_ids, self.max_model_len)
            seq.grammar = grammars[index]
            if adapter is not None:
                seq.lora, seq.lora_id = adapter, adapter.id
            seq.cache_salt = salt_of(seq.lora_id, cache_salt)
            self._arrivals += 1
            seq.share_prompt_from = owner
            owner = owner or seq
            state.seqs.append(seq)
            state.detoks.append(IncrementalDetokenizer(self.tokenizer, prompt_token_ids, params.skip_special_tokens,
                                                       params.stop, params.include_stop_str_in_output))
            self.scheduler.add(seq)
        self.requests[request_id] = state
        self.prompt_tokens += len(prompt_token_ids)

    # ---- LoRA adapters --------------------------------------------------------------------------
    def _adapter_for(self, lora_request: LoRARequest | str):
        if self.lora is None:
            raise ValueError("this engine serves no LoRA adapters; start it with --enable-lora (enable_lora=True)")
        return self.lora.entry_for(lora_request)

    def add_lora(self, name: str, path: str, base_model_name: str | None = None, adapter=None):
        """Register an adapter (``adapter``: what ``self.lora.read(path)`` returned, read off this thread)."""
        if self.lora is None:
            raise ValueError("this engine serves no LoRA adapters; start it with --enable-lora")
        return self.lora.add(name, path, base_model_name, adapter)

    def remove_lora(self, name: str):
        """Unregister ``name`` (``UnknownAdapter`` if none); its running requests finish with it."""
        if self.lora is None:
            raise ValueError("this engine serves no LoRA adapters; start it with --enable-lora")
        return self.lora.remove(name)

    # ---- prompts --------------------------------------------------------------------------------
    def _prompt_ids(self, prompt: str | None, prompt_token_ids: list[int] | None) -> list[int]:
        if prompt_token_ids is None:
            if prompt is None:
                raise ValueError("give a prompt string or prompt_token_ids")
            try:
                prompt_token_ids = list(self.tokenizer.encode(prompt))
            except (TypeError, ValueError, UnicodeError) as e:  # e.g. unpaired surrogates in the text
                raise ValueError(f"the prompt cannot be tokenized: {e}") from e
        ids = [int(t) for t in prompt_token_ids]
        if not ids:
            raise ValueError("the prompt is empty; give at least one token")
        bad = [t for t in ids if not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(f"prompt token ids {bad[:5]} are outside the vocabulary [0, {self.vocab_size})")
        return ids

    def _add_embedding(self, request_id: str, ids: list[int], params: PoolingParams) -> None:
        params.check_dimensions(self.arch.hidden_size)
        if len(ids) > self.max_model_len:
            raise ValueError(f"the input has {len(ids)} tokens but max_model_len is {self.max_model_len}; shorten it, "
                             f"pass truncate_prompt_tokens, or raise --max-model-len")
        # default SamplingParams: what the scheduler reads of any sequence (no prompt logprobs); nothing samples
        seq = Sequence(f"{request_id}#0", request_id, 0, ids, SamplingParams(max_tokens=None), self._arrivals,
                       max_model_len=self.max_model_len, pooling=self.config.model.pooling_type)
        self._arrivals += 1
        self.scheduler.add(seq)
        self.requests[request_id] = EmbeddingState(request_id, seq, params)
        self.prompt_tokens += len(ids)

    def _validate(self, ids: list[int], params: SamplingParams) -> None:
        bad = [t for t in params.stop_token_ids if not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(f"stop_token_ids {bad[:5]} are outside the vocabulary [0, {self.vocab_size})")
        for name, listed in (("logit_bias", params.logit_bias), ("logprob_token_ids", params.logprob_token_ids),
                             ("allowed_token_ids", params.allowed_token_ids)):
            bad = [t for t in (listed or ()) if not 0 <= t < self.vocab_size]
            if bad:
                raise ValueError(f"{name} token ids {bad[:5]} are outside the vocabulary [0, {self.vocab_size})")
        bound = self.config.model.max_logprobs
        for name in ("logprobs", "prompt_logprobs"):
            asked = getattr(params, name)
            if asked is not None and bound != -1 and asked > bound:
                raise ValueError(f"{name} asks for {asked} logprobs per token but at most {bound} are returned "
                                 f"(--max-logprobs); ask for fewer or raise --max-logprobs")
        want = len(ids) + (params.max_tokens or 1)
        if want > self.max_model_len:
            raise ValueError(f"the prompt has {len(ids)} tokens and max_tokens is {params.max_tokens}: "
                             f"{want} tokens exceed max_model_len {self.max_model_len}; shorten the prompt, "
                             f"lower max_tokens, or raise --max-model-len")

    def abort(self, request_id: str) -> None:
        state = self.requests.pop(request_id, None)
        if state is None:
            return
        for seq in state.seqs:
            if not seq.is_finished or seq.block_ids:
                seq.finish("abort")
                self.scheduler.finish(seq)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    # ---- the step -------------------------------------------------------------------------------
    def tier_signals(self) -> TierSignals:
        """What the tier controller looks at before a step; counters are deltas since the last call."""
        pool, sched = self.kv.pool, self.scheduler
        kv_blocks = pool.num_blocks - pool.num_run_blocks
        waiting = self._waiting_blocks()
        wait = self.store.backend.wait_seconds if self.store and self.store.backend else 0.0
        tpots = [(seq.last_token_time - seq.first_token_time) / (len(seq.output_token_ids) - 1)
                 for seq in sched.running if len(seq.output_token_ids) > 1]
        signals = TierSignals(self._steps, kv_blocks, pool.num_free, kv_blocks - pool.num_free, waiting,
                              len(sched.waiting), sched.num_preemptions - self._seen_preemptions,
                              self._step_seconds, wait - self._seen_wait, self._step_tokens, self._step_rows,
                              sum(tpots) / len(tpots) if tpots else None, self.store.layer_run_blocks if self.store and self.store.arena else 0,
                              tuple(self.store.tiers) if self.store else (),
                              self.controller.experts_out if self.controller else 0,
                              len(self.store._expert_runs) if self.store else 0)
        self._seen_preemptions, self._seen_wait, self._step_seconds = sched.num_preemptions, wait, 0.0
        self._step_tokens, self._step_rows = 0, 0
        return signals

    def _waiting_blocks(self) -> int:
        """Free blocks the waiting queue takes when admitted: a prompt prefix that running requests hold is
        shared, not allocated (each waiting sequence's prefix hashes are computed once)."""
        kv, memo = self.kv, {}
        if not kv.enable_prefix_caching:
            return sum(kv.blocks_needed(seq.num_tokens) for seq in self.scheduler.waiting)
        total = 0
        for seq in self.scheduler.waiting:
            known = self._waiting_hashes.get(seq.seq_id)
            if known is None or known[0] != seq.num_tokens:      # new, or preempted with more tokens since
                known = (seq.num_tokens, kv.prefix_hashes(seq.all_token_ids, seq.cache_salt))
            memo[seq.seq_id] = known
            total += kv.blocks_to_admit(seq.num_tokens, known[1])
        self._waiting_hashes = memo
        return total

    def step(self) -> list[RequestOutput | EmbeddingRequestOutput]:
        if self.balancer is not None:
            self.balancer.between_steps()
        if self.controller is not None:
            self.controller.between_steps(self.tier_signals())
        started = time.perf_counter()
        capturing = self.graphs.capture_seconds if self.graphs is not None else 0.0
        self._steps += 1
        out = self.scheduler.schedule()
        if out.is_empty:
            return []
        sampling = [item.seq for item in out.scheduled if item.samples]
        prompt_chunks = {i: (item.seq, item.seq.num_computed_tokens) for i, item in enumerate(out.scheduled)}
        for item in out.scheduled:
            metrics = self.requests[item.seq.group_id].metrics
            metrics.first_scheduled_time = metrics.first_scheduled_time or started
        self.iteration_tokens.observe(out.num_batched_tokens)
        logits = self.runner.run(out)
        self._step_tokens += out.num_batched_tokens
        self._step_rows += len(out.scheduled)
        self.scheduler.step_done(out)
        outputs: list = self._pool(logits.pooled, prompt_chunks)
        touched: dict[str, set[int]] = {}
        for i, chunk_logits in logits.prompt_logits.items():
            seq, start = prompt_chunks[i]
            state = self.requests[seq.group_id]
            if seq.index == 0 and state.prompt_logprobs is not None and len(state.prompt_logprobs) == start + 1:
                state.prompt_logprobs.extend(prompt_logprobs_for_chunk(chunk_logits, seq.prompt_token_ids, start,
                                                                       seq.params.prompt_logprobs))
        if sampling:
            result = self.sampler(logits.sample_logits, sampling)
            stamp = time.perf_counter()
            for seq, token, lp, chosen in zip(sampling, result.token_ids, result.logprobs, result.chosen_logprobs):
                seq.first_token_time = seq.first_token_time or stamp
                seq.last_token_time = stamp
                self._advance(seq, token, lp, chosen)
                touched.setdefault(seq.group_id, set()).add(seq.index)
        for group_id, advanced in touched.items():
            state = self.requests[group_id]
            outputs.append(state.make_output(advanced))
            if state.finished:
                del self.requests[group_id]
        # what a running request waits per token; a graph capture is one-off (after a tier move, it
        # must not read as slow steps that call for the next move)
        captured = self.graphs.capture_seconds - capturing if self.graphs is not None else 0.0
        self._step_seconds += time.perf_counter() - started - captured
        return outputs

    def _pool(self, pooled: dict, prompt_chunks: dict) -> list[EmbeddingRequestOutput]:
        """Add this step's pooled rows to their embedding requests; answer and free those whose input is all in."""
        done = []
        for i, rows_sum in pooled.items():
            seq, start = prompt_chunks[i]
            state = self.requests[seq.group_id]
            state.add_chunk(start, seq.num_computed_tokens, rows_sum)
            if state.finished:
                seq.finish("stop")
                self.scheduler.finish(seq)   # its full blocks stay in the prefix cache
                del self.requests[seq.group_id]
                done.append(state.output())
        return done

    def _advance(self, seq: Sequence, token: int, lp, chosen: float) -> None:
        state = self.requests[seq.group_id]
        seq.append_token(token)
        if seq.grammar is not None:             # the grammar state follows the output tokens exactly
            seq.grammar.accept(token)
        self.generation_tokens += 1
        if lp is not None:
            seq.output_logprobs.append(lp)
            seq.cumulative_logprob += chosen
        finished = seq.check_token_stop(token)
        if not (finished and seq.finish_reason == "stop"):    # EOS and stop token ids add no text
            stop = state.detoks[seq.index].add_token(token)
            if stop is not None:
                finished = seq.finish("stop", stop)
        if finished:
            self.scheduler.finish(seq)

    def stats(self) -> EngineStats:
        pool = self.kv.pool
        cached_free = pool.num_cached_free
        s = self.kv.stats
        tiers = self.store.tier_counts if self.store else {"resident": self.arch.num_layers}
        backend = self.store.backend if self.store else None
        kv_blocks = pool.num_blocks - pool.num_run_blocks   # the rest of the arena holds resident weights
        return EngineStats(len(self.scheduler.running), len(self.scheduler.waiting), kv_blocks,
                           kv_blocks - pool.num_free, cached_free, s.lookups, s.hits, s.hit_tokens,
                           self.scheduler.num_preemptions, self.prompt_tokens, self.generation_tokens,
                           tiers, backend.bytes_copied if backend else 0, backend.wait_seconds if backend else 0.0,
                           pool.num_run_blocks, dict(self.controller.counts) if self.controller else {},
                           self.graphs.captures if self.graphs else 0, self.graphs.pool_bytes if self.graphs else 0,
                           self.store.expert_counts() if self.store and self.store.expert_tiers else {},
                           self.store.expert_ring.backend.bytes_copied if self.store and self.store.expert_ring else 0,
                           self.store.expert_direct_read_bytes() if self.store else 0,
                           self.balancer.swaps if self.balancer else 0,
                           {layer: counts.tolist() for layer, counts in self.store.model.routing_counts().items()}
                           if self.store and self.store.expert_tiers else {},
                           self.iteration_tokens.snapshot(),
                           self.config.lora.max_loras if self.lora is not None else None,
                           adapter_names(self.scheduler.running), adapter_names(self.scheduler.waiting))
