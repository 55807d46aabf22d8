"""``num_speculative_tokens: "auto"``: the k a step drafts, chosen from what was measured.

A step that verifies k drafts for each of B sequences emits B x E(k) tokens, where E(k) = 1 + sum over i of the
chance that the first i drafts are all kept; it costs c(B x (1 + k)), the time of a step computing that many tokens.
The step is worth drafting k where B x E(k) / c(B x (1 + k)) is largest, and k = 0 (no drafting) where nothing beats
a plain decode. Both halves are measured while the engine runs:

- ``AcceptanceModel``: the chance that draft position j is kept once position j - 1 was, per position, from every
  verification (decayed counts, so a workload that changes is followed; a prior keeps an unseen position neutral);
- ``StepCostCurve``: the seconds of decode and verifying steps by the tokens they computed (drafting included).
  Where the link or memory bandwidth bounds a step (streamed or direct weights, the CPU at small batches) the curve
  is flat and k grows; where compute bounds it (resident weights at large batches) it is steep and k shrinks.

Until the curve has two points k is ``k_max``, then 0 (both ends measured where they will be used). Afterwards a step
now and then explores: it drafts the smallest k whose step size was never measured and where the most that k could
give (its step costing no more than the largest step measured below it: more tokens never cost less; its drafts kept
as often as the verifications so far allow, a position few reached counted as kept) beats the best choice; else one
more than the best choice. So a curve that is not a line between its points is found out: on a CPU
whose one-row step reads a GGUF file's blocks and whose steps of more rows take another route, 2 rows cost 2.4x one
row and 4 rows 1.2-1.3x 2 rows, and a line from 1 to 9 rows, or from 2 to 9, hid that k = 3 pays (exploring one more
than the best choice, k = 0, only ever tried k = 1, which does not). The acceptance keeps being measured even while
the best choice is not to draft. An exploring step costs what the best choice saves, so the gap between two of them
doubles (from ``EXPLORE_EVERY`` up to ``EXPLORE_MAX`` steps) while the best choice stays what it was, and is short
again once it moves (exploring every 16th step cost 6% of single-stream decoding on that CPU where no k was found to
pay); an exploring step whose drafter proposed nothing (no n-gram match) measured nothing, and the next step explores
instead.
"""
from __future__ import annotations

from dataclasses import dataclass, field

DECAY = 0.99                 # per verification: the acceptance counts' memory (~100 verifications)
PRIOR_RATE, PRIOR_WEIGHT = 0.5, 2.0
COST_EWMA = 0.2              # a new step's weight in its bucket's seconds
EXPLORE_EVERY = 16           # steps between exploring steps after the best choice moved
EXPLORE_MAX = 256            # ... doubling to this while it stays


@dataclass
class AcceptanceModel:
    k_max: int
    reached: list[float] = field(default_factory=list)     # decayed: verifications that drafted position j and kept
    kept: list[float] = field(default_factory=list)        # every position before it; and kept j too

    def __post_init__(self):
        self.reached = self.reached or [0.0] * self.k_max
        self.kept = self.kept or [0.0] * self.k_max

    def record(self, drafted: int, accepted: int) -> None:
        """One sequence's verification: its first ``accepted`` of ``drafted`` drafts kept."""
        self.reached = [r * DECAY for r in self.reached]
        self.kept = [k * DECAY for k in self.kept]
        for j in range(min(accepted + 1, drafted, self.k_max)):
            self.reached[j] += 1.0
            if j < accepted:
                self.kept[j] += 1.0

    def rate(self, j: int) -> float:
        """The chance that draft position ``j`` (0-based) is kept once every position before it was."""
        return (self.kept[j] + PRIOR_RATE * PRIOR_WEIGHT) / (self.reached[j] + PRIOR_WEIGHT)

    def rate_at_most(self, j: int) -> float:
        """``rate(j)`` with a prior of every draft kept: what position ``j`` may still turn out to be worth while few
        verifications reached it (an exploring step's hope)."""
        return (self.kept[j] + PRIOR_WEIGHT) / (self.reached[j] + PRIOR_WEIGHT)

    def expected_tokens(self, k: int, at_most: bool = False) -> float:
        """Tokens a sequence's step emits with ``k`` drafts: the target's own and the drafts kept (``at_most``: by
        ``rate_at_most``)."""
        total, run = 1.0, 1.0
        for j in range(k):
            run *= self.rate_at_most(j) if at_most else self.rate(j)
            total += run
        return total


def bucket(tokens: int) -> int:
    return tokens if tokens <= 32 else tokens - tokens % 8


@dataclass
class StepCostCurve:
    seconds: dict[int, float] = field(default_factory=dict)    # bucket of tokens -> seconds (EWMA)

    def observe(self, tokens: int, seconds: float) -> None:
        key = bucket(tokens)
        old = self.seconds.get(key)
        self.seconds[key] = seconds if old is None else (1 - COST_EWMA) * old + COST_EWMA * seconds

    def floor(self, tokens: int) -> float:
        """The least a step of ``tokens`` can cost: the most seconds measured at a size up to it (a step of more tokens
        never costs less), or the smallest size's."""
        points = sorted(self.seconds.items())
        assert points, "no step measured yet"
        below = [seconds for size, seconds in points if size <= bucket(tokens)]
        return max(below) if below else points[0][1]

    def cost(self, tokens: int) -> float:
        """Seconds of a step of ``tokens``: between measured sizes linear, below them the smallest's, beyond them
        the last two points' slope (never falling)."""
        points = sorted(self.seconds.items())
        assert points, "no step measured yet"
        if tokens <= points[0][0] or len(points) == 1:
            return points[0][1] if tokens <= points[0][0] else points[-1][1]
        for (n0, s0), (n1, s1) in zip(points, points[1:]):
            if tokens <= n1:
                return s0 + (s1 - s0) * (tokens - n0) / (n1 - n0)
        (n0, s0), (n1, s1) = points[-2], points[-1]
        return s1 + max(0.0, (s1 - s0) / (n1 - n0)) * (tokens - n1)


class AutoK:
    """The k each step drafts (``choose``), from ``record``-ed verifications and ``observe``-d steps."""

    def __init__(self, k_max: int):
        assert k_max >= 1, k_max
        self.k_max = k_max
        self.acceptance = AcceptanceModel(k_max)
        self.curve = StepCostCurve()
        self.choices = 0
        self.last: int | None = None
        self.settled: int | None = None       # the best choice the exploring gap has doubled for
        self.explore_gap = EXPLORE_EVERY
        self.explore_in = EXPLORE_EVERY      # steps until the next exploring step
        self.exploring: int | None = None    # the batch of the exploring step not yet observed

    def record(self, drafted: int, accepted: int) -> None:
        self.acceptance.record(drafted, accepted)

    def observe(self, tokens: int, seconds: float) -> None:
        """A step that computed ``tokens`` decode and draft positions (no prompt) took ``seconds``."""
        if tokens > 0 and seconds > 0:
            self.curve.observe(tokens, seconds)
        if self.exploring is not None:
            if tokens > self.exploring:     # it verified drafts: the next exploring step comes twice as late
                self.explore_gap = min(EXPLORE_MAX, 2 * self.explore_gap)
                self.explore_in = self.explore_gap
            else:                           # its drafter proposed nothing (no n-gram match): explore the next step
                self.explore_in = 1
            self.exploring = None

    def rate(self, batch: int, k: int) -> float:
        """Tokens per second of a step of ``batch`` sequences drafting ``k`` each, as measured so far."""
        return batch * self.acceptance.expected_tokens(k) / self.curve.cost(batch * (1 + k))

    def choose(self, batch: int) -> int:
        """k for a step of ``batch`` drafting sequences."""
        self.choices += 1
        if batch < 1:
            return 0
        if len(self.curve.seconds) < 2:    # both ends measured first: a drafter that always drafts fills only one
            self.last = self.k_max if bucket(batch * (1 + self.k_max)) not in self.curve.seconds else 0
            return self.last
        best = max(range(self.k_max + 1), key=lambda k: (self.rate(batch, k), -k))
        if best != self.settled:
            self.settled, self.explore_gap = best, EXPLORE_EVERY
            self.explore_in = min(self.explore_in, EXPLORE_EVERY)
        self.explore_in -= 1
        if self.explore_in <= 0:
            self.explore_in = self.explore_gap
            best = self.explore(batch, best)
            self.exploring = batch if best else None
        self.last = best
        return best

    def explore(self, batch: int, best: int) -> int:
        """The k an exploring step drafts: the smallest whose step size was never measured and that could beat
        ``best`` (each size measured raises the floor of the larger ones, so the search stops where none could); else
        one more than ``best``."""
        def at_most(k: int) -> float:
            return batch * self.acceptance.expected_tokens(k, at_most=True) / self.curve.floor(batch * (1 + k))
        best_rate = self.rate(batch, best)
        return next((k for k in range(1, self.k_max + 1)
                     if bucket(batch * (1 + k)) not in self.curve.seconds and at_most(k) > best_rate),
                    min(self.k_max, best + 1))
