"""What the engine reports between steps: ``stats()`` (the ``EngineStats`` snapshot the server's /metrics reads)
and ``tier_signals()`` (what the tier controller looks at before a step).

``EngineReports`` is a part of ``LLMEngine`` (engine.py); it reads the engine's parts (KV pool, scheduler, weight
store, controller, balancer, graphs) and the step counters ``LLMEngine.step`` keeps, which ``tier_signals``
turns into deltas since its last call.
"""
from __future__ import annotations

from gh200rt.engine.stats import EngineStats, adapter_names
from gh200rt.engine.tier_controller import TierSignals


class EngineReports:
    def tier_signals(self) -> TierSignals:
        """What the tier controller looks at before a step; counters are deltas since the last call."""
        pool, sched = self.kv.pool, self.scheduler
        kv_blocks = pool.num_blocks - pool.num_run_blocks
        waiting = self._waiting_blocks()
        # finished waits only: reading the rest would block until the step launched ahead has run
        wait = self.store.backend.finished_wait_seconds() if self.store and self.store.backend else 0.0
        tpots = [(seq.last_token_time - seq.first_token_time) / (len(seq.output_token_ids) - 1)
                 for seq in sched.running if len(seq.output_token_ids) > 1]
        excess, samples = self.runner.layer_times.take() if self.runner.layer_times is not None else (None, ())
        signals = TierSignals(self._steps, kv_blocks, pool.num_free, kv_blocks - pool.num_free, waiting,
                              len(sched.waiting), sched.num_preemptions - self._seen_preemptions,
                              self._step_seconds, wait - self._seen_wait, self._step_tokens, self._step_rows,
                              sum(tpots) / len(tpots) if tpots else None, self.store.layer_run_blocks if self.store and self.store.arena else 0,
                              tuple(self.store.tiers) if self.store else (),
                              self.controller.experts_out if self.controller else 0,
                              len(self.store._expert_runs) if self.store else 0, len(sched.running),
                              sched.preempted_tokens - self._seen_preempted_tokens[0],
                              sched.preempted_kept_tokens - self._seen_preempted_tokens[1],
                              self.host_tier.load_seconds_per_block / self.kv.block_size
                              if self.host_tier is not None else None, excess, samples)
        self._seen_preemptions, self._seen_wait, self._step_seconds = sched.num_preemptions, wait, 0.0
        self._seen_preempted_tokens = (sched.preempted_tokens, sched.preempted_kept_tokens)
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
                           adapter_names(self.scheduler.running), adapter_names(self.scheduler.waiting),
                           self.steps_launched_ahead, self.rows_discarded,
                           self.host_tier.report() if self.host_tier is not None else None,
                           self.speculator.stats.copy() if self.speculator is not None else None,
                           self.store.cpu_tier_counts() if self.store and self.store.expert_tiers else {})
