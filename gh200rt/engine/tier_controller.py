"""Tiers that follow KV demand (``--offload dynamic``): between steps, move one layer at a time.

Before each step the engine hands the controller a ``TierSignals`` snapshot: the arena's KV blocks
(total, free, held by requests), the blocks the waiting queue needs to be admitted, preemptions and
step time (wall, and the copy wait in it) since the last look. The policy answers with at most one move:
- **demote** (a resident layer starts streaming, its arena run goes to the KV cache) when requests
  wait for blocks the cache does not have, or a request was preempted, unless the step with one
  more streamed layer would take longer than ``max_step_seconds`` (``--retier-max-step-seconds``, a
  TPOT target: more KV is not worth making every running request slower than that), or unless it does
  not pay: the running requests and those one layer's run of KV admits, at the predicted decode step, must
  produce more tokens per second than the running ones do now at theirs (decode steps: the prompt chunks
  beside them are paid either way), counting against "now" the work preemptions redo, as a rate over the
  last ``REDO_WINDOW_STEPS`` steps: their tokens recomputed at the fitted cost of a prompt token, or, for the
  blocks the host KV tier keeps, loaded back at its measured cost. So the three answers to KV pressure (a slower step,
  a recompute, a load from host memory) are priced from measured costs each look: with the tier, preemption
  costs little and the layer stays; without it, lost KV is dear and a demotion pays sooner (where a layer
  costs much and buys KV for few requests, as on the CPU, the host tier and preemption take it). The step with
  one more layer is predicted by ``StepCostModel`` (engine/step_cost.py): the recent step time plus
  a streamed layer's cost fitted over the steps that ran, mixed steps included, or where the host runs the step (the
  CPU platform) timed where the offloaded layers run (engine/layer_times.py);
- **promote** (a streamed layer takes a free run back) when nothing waits, no preemption happened
  for a while, and after the promotion at least ``promote_headroom`` of the KV cache would still
  be free beyond what running requests hold; or, with a TPOT target, when recent steps take longer
  than the target and the cache has a free run (shorter steps for the running requests, at the
  price of KV the queue wanted).
Hysteresis: at least ``min_steps_between`` steps and ``min_dwell_seconds`` between two moves, except
that a run of moves in one direction goes one per step while its reason lasts: demotions while the
pressure lasts (a burst must not wait ``min_steps_between`` steps per layer for KV it needs now), and
slack promotions while at least two more layers' runs would stay free (the tail of a burst gets its
speed back as the queue drains). A reversal always waits.
Streamed layers stay spread: a demotion picks the resident layer farthest from any streamed one,
a promotion the streamed layer closest to another, so the copies keep hiding behind resident
compute (one in every G). Each move is logged at INFO with its reason and numbers; ``counts``
feeds ``/metrics`` (``gh200rt_retier_total{direction}``).
"""
from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Protocol

from gh200rt.engine.step_cost import StepCostModel
from gh200rt.memory.ledger import LedgerOverCommit
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
    step_seconds: float           # wall time of the steps since the last snapshot (schedule to outputs)
    copy_wait_seconds: float
    step_tokens: int              # tokens those steps batched (0: none ran)
    step_rows: int                # sequences those steps ran
    tpot_seconds: float | None    # mean time per output token so far of the running requests (None: none has 2)
    run_blocks: int               # arena blocks one layer's weights take
    tiers: tuple[Tier, ...]
    experts_out: int = 0          # routed experts the controller moved out of the arena for KV (may come back)
    experts_in: int = 0           # routed experts resident in arena runs (KV pressure may move them out)
    num_running: int | None = None   # sequences running now (None: not known; demotions are then not priced)
    preempted_tokens: int = 0     # computed tokens the preemptions since the last snapshot let go of
    preempted_kept_tokens: int = 0   # of those, the tokens the host KV tier keeps (loaded back, not recomputed)
    load_seconds_per_token: float | None = None   # what loading a token's KV from the host tier costs (None: no tier)
    # where the layers are timed (the CPU platform, engine/layer_times.py): what the offloaded layers of the steps
    # since the last snapshot took beyond resident ones (None: not timed), and per step (one layer's excess, tokens)
    offloaded_excess_seconds: float | None = None
    offloaded_layer_samples: tuple[tuple[float, int], ...] = ()


@dataclass(frozen=True)
class Move:
    layer: int | None             # None: routed experts worth one layer's run come back (TierController)
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


# demotions stop once the predicted step passes this share of --retier-max-step-seconds: the prediction
# leaves out the prefill chunks of the requests a demotion admits, and the target is a ceiling, not a goal
STEP_GUARD = 0.8
# preemptions are priced as a rate: the work they made the engine redo over the last this many steps, per step. The
# controller looks before every step, so "since the last look" put a whole preemption's recompute into one step's
# price, and one preemption bought a layer's copy on every later step (on an H200 the dynamic engine demoted six
# layers on a burst all-resident served at 1.7x its goodput, recomputing seven requests)
REDO_WINDOW_STEPS = 32


@dataclass
class PressurePolicy:
    min_steps_between: int = 8
    min_dwell_seconds: float = 2.0
    promote_headroom: float = 0.25
    max_step_seconds: float | None = None
    costs: StepCostModel = field(default_factory=lambda: StepCostModel(0.0))
    clock: callable = time.monotonic
    _last_step: int = field(default=-(1 << 30), repr=False)
    _last_time: float = field(default=float("-inf"), repr=False)
    _quiet_since: int = field(default=0, repr=False)
    _last_tier: Tier | None = field(default=None, repr=False)
    declined: int = field(default=0, repr=False)     # looks under KV pressure where a demotion did not pay
    _redone: deque = field(default_factory=deque, repr=False)    # (step, seconds) the preemptions made the engine redo

    def decide(self, signals: TierSignals) -> Move | None:
        now = self.clock()
        streamed = signals.tiers.count(Tier.STREAMED)
        self.costs.observe(signals.step_seconds, signals.step_tokens, signals.step_rows, streamed,
                           signals.offloaded_excess_seconds)
        self.costs.observe_layers(signals.offloaded_layer_samples)
        redo = self._redo_per_step(signals)
        pressure = signals.preemptions > 0 or (signals.num_waiting and signals.waiting_blocks > signals.kv_free_blocks)
        if pressure:
            self._quiet_since = signals.step
        after = signals.kv_total_blocks - signals.run_blocks          # KV blocks left if one layer promotes
        free_after = after - signals.kv_held_blocks
        slack = (not pressure and not signals.num_waiting and signals.step - self._quiet_since >= self.min_steps_between
                 and free_after >= self.promote_headroom * after)
        # steps over the target promote a layer back, on step time alone: a preempted request's TPOT so
        # far keeps its wait in the queue, and taking KV back would only add preemptions
        steps = self.costs.recent_seconds
        over = self.max_step_seconds is not None and steps is not None and steps > self.max_step_seconds
        # a demotion must keep what running requests see (the recent steps, or their TPOT so far where
        # preemptions and prefill chunks made it longer) under the target
        recent = steps if steps is None or signals.tpot_seconds is None else max(steps, signals.tpot_seconds)
        # the requests one layer's run admits join every step: at most the queue, at its mean prompt size
        admitted = min(signals.num_waiting, signals.run_blocks * signals.num_waiting / signals.waiting_blocks) \
            if signals.waiting_blocks else 0.0
        next_step = self.costs.predict_next(admitted, recent)
        too_slow = (self.max_step_seconds is not None and next_step is not None
                    and next_step > STEP_GUARD * self.max_step_seconds)
        if self._last_tier == Tier.STREAMED:
            streak = pressure and not too_slow
        else:
            streak = slack and free_after - 2 * signals.run_blocks >= self.promote_headroom * after
        if not (streak and signals.step > self._last_step) and (
                signals.step - self._last_step < self.min_steps_between or now - self._last_time < self.min_dwell_seconds):
            return None
        move = None
        # priced on decode steps where the fit has them: the recent steps carry prompt chunks paid either way
        now_decode = after_decode = None
        if signals.num_running:
            now_decode = self.costs.decode_seconds(signals.num_running, streamed)
            after_decode = self.costs.decode_seconds(signals.num_running + admitted, streamed + 1)
        base, after = (now_decode, after_decode) if now_decode and after_decode else (recent, next_step)
        pays = signals.experts_in or self._pays(signals.num_running, base, after, admitted, redo)
        if pressure and not too_slow and not over and not pays:
            self.declined += 1
            if self.declined == 1 or self.declined % 100 == 0:
                log.info("KV pressure, but one more streamed layer would lower the batch's tokens per second "
                         "(%d running at %.1f ms a decode step, preemptions redoing %.1f ms a step; %.1f admitted at "
                         "%.1f ms predicted): not demoting (%d declined so far)", signals.num_running, base * 1e3,
                         redo * 1e3, admitted, after * 1e3, self.declined)
        if pressure and not too_slow and not over and pays:
            # routed experts go first (TierController), then layers
            layer = None if signals.experts_in else spread_pick(signals.tiers, Tier.RESIDENT, None, farthest=True)
            if layer is not None or signals.experts_in:
                move = Move(layer, Tier.STREAMED,
                            f"KV pressure: {signals.num_waiting} waiting need {signals.waiting_blocks} blocks, "
                            f"{signals.kv_free_blocks} of {signals.kv_total_blocks} free, "
                            f"{signals.preemptions} preempted since the last look "
                            f"({self._preemption_note(signals, redo)}); "
                            f"{self._step_note(recent, next_step, admitted)}"
                            + (f"; decode step {now_decode * 1e3:.1f} -> {after_decode * 1e3:.1f} ms"
                               if now_decode and after_decode else ""))
        elif (streamed or signals.experts_out) and (slack or (over and signals.kv_free_blocks >= signals.run_blocks)):
            # layers first: every step reads all of a layer, but only the routed few of its experts
            layer = spread_pick(signals.tiers, Tier.STREAMED, Tier.STREAMED, farthest=False) if streamed else None
            why = (f"KV slack: requests hold {signals.kv_held_blocks} of {signals.kv_total_blocks} blocks, "
                   f"{free_after} stay free after giving {signals.run_blocks} to the layer") if slack else \
                (f"steps over the target: {steps * 1e3:.1f} ms > {self.max_step_seconds * 1e3:.1f} ms, "
                 f"{signals.kv_free_blocks} KV blocks free")
            move = Move(layer, Tier.RESIDENT, f"{why}; copy wait {signals.copy_wait_seconds * 1e3:.1f} ms of "
                                              f"{signals.step_seconds * 1e3:.1f} ms since the last look")
        if move is not None:
            self._last_step, self._last_time, self._last_tier = signals.step, now, move.tier
        return move

    def _redo_per_step(self, signals: TierSignals) -> float:
        """The work preemptions made the engine redo over the last ``REDO_WINDOW_STEPS`` steps (fewer at start-up),
        per step."""
        seconds = self.preemption_seconds(signals)
        if seconds:
            self._redone.append((signals.step, seconds))
        while self._redone and self._redone[0][0] <= signals.step - REDO_WINDOW_STEPS:
            self._redone.popleft()
        return sum(s for _, s in self._redone) / max(1, min(REDO_WINDOW_STEPS, signals.step))

    def preemption_seconds(self, signals: TierSignals) -> float:
        """The work the preemptions in ``signals`` make the engine redo: their tokens the host KV tier does not
        keep, recomputed at the fitted cost of a prompt token, and those it keeps, loaded at the tier's measured
        cost (0 where neither cost is known yet)."""
        kept = min(signals.preempted_kept_tokens, signals.preempted_tokens)
        token = self.costs.token_seconds
        recompute = (signals.preempted_tokens - kept) * token if token is not None else 0.0
        load = kept * signals.load_seconds_per_token if signals.load_seconds_per_token is not None else 0.0
        return recompute + load

    @staticmethod
    def _pays(running: int | None, recent: float | None, next_step: float | None, admitted: float,
              redo: float = 0.0) -> bool:
        """Whether one more streamed layer raises the batch's tokens per second: the ``running`` sequences and the
        ``admitted`` ones its run of KV lets in, at the predicted step, against the running ones now, each step of
        which also pays ``redo`` seconds of preempted work (recomputed, or loaded back from the host KV tier) that
        the layer's KV spares. So KV pressure has three answers priced alike: a demotion (a slower step), a
        preemption that recomputes, and one whose blocks come back from host memory (cheap: the tier takes the
        pressure and the layer stays)."""
        if not running or recent is None or next_step is None or recent <= 0:
            return True
        return (running + admitted) / next_step > running / (recent + redo)

    def _preemption_note(self, signals: TierSignals, redo: float) -> str:
        kept = min(signals.preempted_kept_tokens, signals.preempted_tokens)
        return (f"{signals.preempted_tokens - kept} tokens to recompute, {kept} to load from host memory: "
                f"{redo * 1e3:.1f} ms a step over the last {REDO_WINDOW_STEPS} steps")

    def _step_note(self, recent: float | None, next_step: float | None, admitted: float) -> str:
        if next_step is None:
            return "no step timed yet"
        return (f"step {recent * 1e3:.1f} ms, {next_step * 1e3:.1f} ms predicted with one more "
                f"streamed layer ({self.costs.layer_seconds * 1e3:.2f} ms per layer) and {admitted:.1f} more "
                f"requests ({self.costs.row_seconds * 1e3:.2f} ms each)")


class TierController:
    """Applies a policy's moves through the weight store, between steps. With an MoE model whose resident
    experts hold arena runs, KV pressure first moves routed experts out (the least used, per ``usage``: a
    step reads only the experts it routes to, but all of every layer), as many as free one layer's run, to
    ``expert_tier`` (read in place, or streamed where the link is slow); slack brings the most used back
    once no layer streams. ``experts_out`` counts those the controller moved out."""

    def __init__(self, store, policy: TierPolicy, usage=None, expert_tier: Tier = Tier.DIRECT):
        self.store, self.policy = store, policy
        self.usage, self.expert_tier = usage, expert_tier
        self.counts = {"promote": 0, "demote": 0}
        self.expert_counts = {"promote": 0, "demote": 0}
        self.experts_out = 0
        self.refused = 0

    def between_steps(self, signals: TierSignals, before_move: Callable[[], None] | None = None) -> Move | None:
        """Decide on ``signals`` and make the move, if any; ``before_move``: called first (the engine lets a step
        launched ahead finish on the device: it reads the weights a move changes)."""
        move = self.policy.decide(signals)
        if move is None:
            return None
        if move.layer is not None and self.store.tiers[move.layer] == move.tier:
            return None
        if before_move is not None:
            before_move()
        if move.layer is None:
            return self._move_experts(move, signals.run_blocks)
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

    # ---- routed experts ----------------------------------------------------------------------------
    def _arena_experts(self) -> list[tuple[int, int]]:
        return list(getattr(self.store, "_expert_runs", {}))

    def _usage_of(self, layer: int, expert: int) -> float:
        usage = self.usage() if self.usage is not None else {}
        counts = usage.get(layer)
        return float(counts[expert]) if counts is not None else 0.0

    def _move_experts(self, move: Move, run_blocks: int) -> Move | None:
        """As many experts as free (or take) one layer's run of blocks: out the least used, back the most used."""
        count = max(1, run_blocks // max(1, self.store.expert_run_blocks))
        start = time.perf_counter()
        if move.tier == Tier.STREAMED:
            picks = sorted(self._arena_experts(), key=lambda le: (self._usage_of(*le), le))[:count]
            for layer, expert in picks:
                self.store.set_expert_tier(layer, expert, self.expert_tier)
            self.experts_out += len(picks)
            direction = "demote"
        else:
            out = [(layer, e) for layer, tiers in self.store.expert_tiers.items() for e, t in enumerate(tiers)
                   if t != Tier.RESIDENT]
            picks = []
            for layer, expert in sorted(out, key=lambda le: (-self._usage_of(*le), le))[:min(count, self.experts_out)]:
                try:
                    self.store.set_expert_tier(layer, expert, Tier.RESIDENT)
                except (NoFreeRun, LedgerOverCommit) as err:
                    self.refused += 1
                    log.info("promotion of layer %d's expert %d refused: %s", layer, expert, err)
                    break
                picks.append((layer, expert))
            self.experts_out -= len(picks)
            direction = "promote"
        if not picks:
            return None
        self.expert_counts[direction] += len(picks)
        log.info("%s %d routed experts (%s) in %.1f ms (%s); %d now out of the arena for KV", direction, len(picks),
                 ", ".join(f"{layer}/{e}" for layer, e in picks), (time.perf_counter() - start) * 1e3, move.reason,
                 self.experts_out)
        return Move(None, move.tier, move.reason)
