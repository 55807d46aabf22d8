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

Until the curve has two points k is ``k_max`` (the curve is measured where it will be used); afterwards one step in
``EXPLORE_EVERY`` drafts one more than the best choice, so the curve is extended beyond the sizes in use and the
acceptance keeps being measured even while the best choice is not to draft.
"""
from __future__ import annotations

from dataclasses import dataclass, field

DECAY = 0.99                 # per verification: the acceptance counts' memory (~100 verifications)
PRIOR_RATE, PRIOR_WEIGHT = 0.5, 2.0
COST_EWMA = 0.2              # a new step's weight in its bucket's seconds
EXPLORE_EVERY = 16


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

    def expected_tokens(self, k: int) -> float:
        """Tokens a sequence's step emits with ``k`` drafts: the target's own and the drafts kept."""
        total, run = 1.0, 1.0
        for j in range(k):
            run *= self.rate(j)
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

    def record(self, drafted: int, accepted: int) -> None:
        self.acceptance.record(drafted, accepted)

    def observe(self, tokens: int, seconds: float) -> None:
        """A step that computed ``tokens`` decode and draft positions (no prompt) took ``seconds``."""
        if tokens > 0 and seconds > 0:
            self.curve.observe(tokens, seconds)

    def rate(self, batch: int, k: int) -> float:
        """Tokens per second of a step of ``batch`` sequences drafting ``k`` each, as measured so far."""
        return batch * self.acceptance.expected_tokens(k) / self.curve.cost(batch * (1 + k))

    def choose(self, batch: int) -> int:
        """k for a step of ``batch`` drafting sequences."""
        self.choices += 1
        if batch < 1:
            return 0
        if len(self.curve.seconds) < 2:
            self.last = self.k_max
            return self.k_max
        best = max(range(self.k_max + 1), key=lambda k: (self.rate(batch, k), -k))
        if self.choices % EXPLORE_EVERY == 0:
            best = min(self.k_max, best + 1)
        self.last = best
        return best
