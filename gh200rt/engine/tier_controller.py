"""Tiers that follow KV demand (``--offload dynamic``): between steps, move one layer at a time.

Before each step the engine hands the controller a ``TierSignals`` snapshot: the arena's KV blocks
(total, free, held by requests), the blocks the waiting queue needs to be admitted, preemptions and
step time (compute vs copy wait) since the last look. The policy answers with at most one move:
- **demote** (a resident layer starts streaming, its arena run goes to the KV cache) when requests
  wait for blocks the cache does not have, or a request was preempted, unless decode steps already
  take ``max_step_seconds`` (``--retier-max-step-seconds``, a TPOT target: more KV is not worth
  making every running request slower than that);
- **promote** (a streamed layer takes a free run back) when nothing waits, no preemption happened
  for a while, and after the promotion at least ``promote_headroom`` of the KV cache would still
  be free beyond what running requests hold.
Hysteresis: at least ``min_steps_between`` steps and ``min_dwell_seconds`` between two moves, except
that demotions follow each other one per step while the pressure lasts (a burst must not wait
``min_steps_between`` steps per layer for KV it needs now; a reversal always waits).
Streamed layers stay spread: a demotion picks the resident layer farthest from any streamed one,
a promotion the streamed layer closest to another, so the copies keep hiding behind resident
compute (one in every G). Each move is logged at INFO with its reason and numbers; ``counts``
feeds ``/metrics`` (``gh200rt_retier_total{direction}``).
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Protocol

from gh200rt.weights.store import NoFreeRun
from gh200rt.weights.tiers import Tier

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TierSignals:
    step: int
    kv_total_blocks: int          # the arena's blocks the KV cache has now
    kv_free_blocks: int
    kv_held_blocks: int           # held by running requests
    waiting_blocks: int           # what the waiting queue needs to be admitted (prompt blocks)
    num_waiting: int
    preemptions: int              # since the last snapshot
    compute_seconds: float        # since the last snapshot
    copy_wait_seconds: float
    decode_step_seconds: float | None   # mean model time of the decode-only steps since then (None: none ran)
    run_blocks: int               # arena blocks one layer's weights take
    tiers: tuple[Tier, ...]


@dataclass(frozen=True)
class Move:
    layer: int
    tier: Tier
    reason: str


class TierPolicy(Protocol):
    def decide(self, signals: TierSignals) -> Move | None: ...


def spread_pick(tiers: tuple[Tier, ...], candidates: Tier, others: Tier | None, farthest: bool) -> int | None:
    """Among layers of tier ``candidates``, the one farthest from (or closest to) a layer of tier ``others``
    (any non-candidate layer when ``others`` is None); ties go to the later layer."""
    picks = [i for i, t in enumerate(tiers) if t == candidates]
    marks = [i for i, t in enumerate(tiers) if (t == others if others is not None else t != candidates)]
    if not picks:
        return None
    if not marks:
        return picks[len(picks) // 2]

    def distance(i: int) -> int:
        return min(abs(i - m) for m in marks if m != i) if any(m != i for m in marks) else len(tiers)

    key = (lambda i: (distance(i), i)) if farthest else (lambda i: (-distance(i), i))
    return max(picks, key=key)


# demotions stop once decode steps take this share of --retier-max-step-seconds: the next streamed layer
# adds its copy to every step, and the target is a ceiling, not a goal
STEP_GUARD = 0.9


@dataclass
class PressurePolicy:
    min_steps_between: int = 8
    min_dwell_seconds: float = 2.0
    promote_headroom: float = 0.25
    max_step_seconds: float | None = None
    clock: callable = time.monotonic
    _last_step: int = field(default=-(1 << 30), repr=False)
    _last_time: float = field(default=float("-inf"), repr=False)
    _quiet_since: int = field(default=0, repr=False)
    _last_tier: Tier | None = field(default=None, repr=False)

    def decide(self, signals: TierSignals) -> Move | None:
        now = self.clock()
        pressure = signals.preemptions > 0 or (signals.num_waiting and signals.waiting_blocks > signals.kv_free_blocks)
        if pressure:
            self._quiet_since = signals.step
        streak = pressure and self._last_tier == Tier.STREAMED and signals.step > self._last_step
        if not streak and (signals.step - self._last_step < self.min_steps_between
                           or now - self._last_time < self.min_dwell_seconds):
            return None
        move = None
        slow = (self.max_step_seconds is not None and signals.decode_step_seconds is not None
                and signals.decode_step_seconds > STEP_GUARD * self.max_step_seconds)
        if pressure and not slow:
            layer = spread_pick(signals.tiers, Tier.RESIDENT, None, farthest=True)
            if layer is not None:
                move = Move(layer, Tier.STREAMED,
                            f"KV pressure: {signals.num_waiting} waiting need {signals.waiting_blocks} blocks, "
                            f"{signals.kv_free_blocks} of {signals.kv_total_blocks} free, "
                            f"{signals.preemptions} preempted since the last look")
        elif signals.step - self._quiet_since >= self.min_steps_between and not signals.num_waiting:
            after = signals.kv_total_blocks - signals.run_blocks
            free_after = after - signals.kv_held_blocks
            if free_after >= self.promote_headroom * after:
                layer = spread_pick(signals.tiers, Tier.STREAMED, Tier.STREAMED, farthest=False)
                if layer is not None:
                    move = Move(layer, Tier.RESIDENT,
                                f"KV slack: requests hold {signals.kv_held_blocks} of {signals.kv_total_blocks} "
                                f"blocks, {free_after} stay free after giving {signals.run_blocks} to the layer; "
                                f"copy wait {signals.copy_wait_seconds * 1e3:.1f} ms of "
                                f"{signals.compute_seconds * 1e3:.1f} ms since the last look")
        if move is not None:
            self._last_step, self._last_time, self._last_tier = signals.step, now, move.tier
        return move


class TierController:
    """Applies a policy's moves through the weight store, between steps."""

    def __init__(self, store, policy: TierPolicy):
        self.store, self.policy = store, policy
        self.counts = {"promote": 0, "demote": 0}
        self.refused = 0

    def between_steps(self, signals: TierSignals) -> Move | None:
        move = self.policy.decide(signals)
        if move is None or self.store.tiers[move.layer] == move.tier:
            return None
        start = time.perf_counter()
        try:
            self.store.set_tier(move.layer, move.tier)
        except NoFreeRun as err:
            self.refused += 1
            log.info("tier move of layer %d to %s refused: %s", move.layer, move.tier, err)
            return None
        direction = "promote" if move.tier == Tier.RESIDENT else "demote"
        self.counts[direction] += 1
        counts = self.store.tier_counts
        log.info("%s layer %d to %s in %.1f ms (%s); tiers now %d resident / %d streamed / %d direct",
                 direction, move.layer, move.tier, (time.perf_counter() - start) * 1e3, move.reason,
                 counts["resident"], counts["streamed"], counts["direct"])
        return move
