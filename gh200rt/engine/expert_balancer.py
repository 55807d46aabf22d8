"""Expert placement that learns the routing (``--offload dynamic``): the most-used experts resident.

A router does not pick experts evenly: a few take a large share of a workload's tokens, and which ones
depends on the workload. The start-up split (``--moe-expert-tier auto``) keeps the lowest ids resident; the
balancer, every ``interval_steps`` steps, reads each MoE layer's routing counts (``SparseMoeBlock._count``:
device counters, read once per look), keeps an exponentially decayed usage per expert (``decay`` per look,
so a change of workload shows within a few looks), and swaps the least-used resident expert with the
most-used offloaded one while the latter's usage exceeds the former's by ``margin`` (and by at least
``min_tokens``): hysteresis, so two experts of similar use do not trade places back and forth. A swap
demotes first, then promotes, so it needs no device memory beyond the expert it frees; at most
``max_swaps`` per layer per look bound the copies between two steps. Swaps go through
``WeightStore.set_expert_tier`` (placement changes bump ``plan_version``, so captured graphs are
recaptured) and are counted for ``/metrics`` (``gh200rt_moe_expert_swaps_total``).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Callable

import torch

from gh200rt.memory.ledger import LedgerOverCommit
from gh200rt.weights.tiers import Tier

log = logging.getLogger(__name__)


@dataclass
class ExpertBalancer:
    store: object
    model: object
    interval_steps: int = 8
    decay: float = 0.5
    margin: float = 0.5
    min_tokens: float = 4.0
    max_swaps: int = 2
    swaps: int = 0
    _usage: dict[int, torch.Tensor] = field(default_factory=dict, repr=False)
    _seen: dict[int, torch.Tensor] = field(default_factory=dict, repr=False)
    _steps: int = field(default=0, repr=False)

    def between_steps(self, before_swaps: Callable[[], None] | None = None) -> list[tuple[int, int, int]]:
        """Swaps made before this step, as (layer, promoted expert, demoted expert); ``before_swaps``: called first on
        the steps that may swap (the engine lets a step launched ahead finish on the device: it reads the experts)."""
        self._steps += 1
        if self._steps % self.interval_steps:
            return []
        if before_swaps is not None:
            before_swaps()
        made = []
        for layer, counts in self.model.routing_counts().items():
            if layer not in self.store.expert_tiers:
                continue
            seen = self._seen.get(layer, torch.zeros_like(counts))
            usage = self._usage.get(layer, torch.zeros(counts.shape, dtype=torch.float64))
            usage = usage * self.decay + (counts - seen).double()
            self._seen[layer], self._usage[layer] = counts, usage
            made += [(layer, hot, cold) for hot, cold in self._rebalance(layer, usage)]
        if made:
            self.swaps += len(made)
            log.info("expert placement follows routing: %s", ", ".join(
                f"layer {layer} expert {hot} resident, expert {cold} out" for layer, hot, cold in made))
        return made

    def _rebalance(self, layer: int, usage: torch.Tensor) -> list[tuple[int, int]]:
        tiers = self.store.expert_tiers[layer]
        made = []
        for _ in range(self.max_swaps):
            resident = [e for e, t in enumerate(tiers) if t == Tier.RESIDENT]
            offloaded = [e for e, t in enumerate(tiers) if t != Tier.RESIDENT]
            if not resident or not offloaded:
                break
            cold = min(resident, key=lambda e: (float(usage[e]), -e))
            hot = max(offloaded, key=lambda e: (float(usage[e]), -e))
            if usage[hot] < (1 + self.margin) * usage[cold] + self.min_tokens:
                break
            tier = tiers[hot]
            self.store.set_expert_tier(layer, cold, tier)      # demote first: the promotion reuses its bytes
            try:
                self.store.set_expert_tier(layer, hot, Tier.RESIDENT)
            except LedgerOverCommit as err:                    # e.g. a CPU route form larger than the one freed
                self.store.set_expert_tier(layer, cold, Tier.RESIDENT)
                log.info("layer %d: expert %d stays %s: %s", layer, hot, tier, err)
                break
            made.append((hot, cold))
        return made

    def usage(self) -> dict[int, torch.Tensor]:
        """MoE layer -> each expert's decayed usage (what the tier controller orders experts by)."""
        return dict(self._usage)

    def resident_share(self) -> float | None:
        """Of the routed (token, choice) pairs in the decayed window, the share that went to resident experts."""
        total = resident = 0.0
        for layer, usage in self._usage.items():
            tiers = self.store.expert_tiers[layer]
            total += float(usage.sum())
            resident += sum(float(usage[e]) for e, t in enumerate(tiers) if t == Tier.RESIDENT)
        return resident / total if total else None
