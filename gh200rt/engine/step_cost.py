"""What one more streamed layer adds to a step, learned from the steps the engine runs.

The tier controller must not stream a layer whose copy makes every step slower than the TPOT target.
The steps it sees during a burst are mixed (decodes beside prefill chunks of varying length), so no
single step time answers "what does a streamed layer cost": the model fits

    step seconds ~= a + b * tokens + c * rows + d * streamed layers

by least squares over the last ``window`` steps, where ``d`` is the answer, and ``b + c`` is what each
request the freed KV admits adds to every step once it decodes (on a GPU decode is bound by reading
weights and a row costs little; on the CPU compute grows with the batch). While the window holds
too few distinct splits to tell ``d`` apart from the intercept, a prior (the cost model's copy time of
one layer) holds it: one pseudo-observation pulls ``d`` toward the prior with the weight of
``prior_weight`` steps, so the data take over as soon as the splits vary. ``recent_seconds`` is the
mean time of the last ``RECENT_STEPS`` steps, the TPOT the running requests see now (a mean over
enough steps that a few short decode steps between prefill chunks do not open the guard).
``decode_seconds`` is the fit's decode-only step, ``a + (b + c) * rows + d * streamed``: what prices a
demotion, since the prefill chunks in the recent steps are paid whether the waiting requests are admitted
now or later (with them in the base, a layer's copy looked cheap against a step swollen by prompts).

Where the host runs the step (the CPU platform), the offloaded layers are timed where they run (engine/layer_times.py)
and the fit is not asked for ``d``: a burst's steps cannot tell it apart from the rows (the batch grows while layers
stream; on a Zen 5 the fitted ``d`` fell from 0.71 to 0 ms while a streamed layer measured 0.6-1.4 ms). Each step's
measured excess (what its offloaded layers took beyond resident ones) is taken off its time, so the fit sees the step
all-resident would have run, and a layer's cost is a second fit, ``excess of one offloaded layer ~= e0 + e1 * tokens``
over the timed steps: on the CPU an op-by-op layer costs more the more rows it multiplies.
"""
from __future__ import annotations

from collections import deque

import numpy as np

RECENT_STEPS = 16


class StepCostModel:
    def __init__(self, prior_layer_seconds: float, window: int = 256, prior_weight: float = 32.0):
        assert prior_layer_seconds >= 0 and window >= 8
        self.prior = prior_layer_seconds
        self.prior_weight = prior_weight
        self._steps: deque[tuple[float, int, int, int]] = deque(maxlen=window)
        self._fit: tuple[float, float, float | None, float | None] | None = None
        self._layers: deque[tuple[float, int]] = deque(maxlen=window)   # timed: (one offloaded layer's excess, tokens)
        self._layer_fit: tuple[float, float] | None = None
        self.streamed = 0         # the offloaded layers of the last step observed

    def observe(self, seconds: float, tokens: int, rows: int, streamed: int, excess: float | None = None) -> None:
        """One step's model time, its batched tokens and sequences, and the layers that streamed in it; ``excess``:
        the seconds those layers took beyond resident ones, where they were timed (None: not timed, fitted)."""
        self.streamed = streamed
        if tokens <= 0:
            return
        if excess is not None:
            seconds, streamed = seconds - excess, 0
        self._steps.append((seconds, tokens, rows, streamed))
        self._fit = None

    def observe_layers(self, samples) -> None:
        """Timed steps' ``(excess of one offloaded layer, tokens)`` (``LayerTimes.take``)."""
        for sample in samples:
            self._layers.append(sample)
            self._layer_fit = None

    @property
    def timed(self) -> bool:
        """Whether a streamed layer's cost comes from timed layers (enough of them) rather than the fit."""
        return len(self._layers) >= 4

    def layer_seconds_at(self, tokens: float) -> float:
        """What one more offloaded layer adds to a step of ``tokens`` tokens: timed where enough layers were, else the
        fit's ``d`` (never below zero: a copy is not a speed-up)."""
        if not self.timed:
            return self._coefficients()[0]
        if self._layer_fit is None:
            data = np.asarray(self._layers, dtype=np.float64)
            x = np.column_stack((np.ones(len(data)), data[:, 1]))
            (e0, e1), *_ = np.linalg.lstsq(x, data[:, 0], rcond=None)
            if e1 < 0:       # costs more at fewer tokens: noise, or one step size only; the mean then
                e0, e1 = float(data[:, 0].mean()), 0.0
            self._layer_fit = float(e0), float(e1)
        e0, e1 = self._layer_fit
        return max(0.0, e0 + e1 * tokens)

    @property
    def recent_seconds(self) -> float | None:
        """Mean time of the last ``RECENT_STEPS`` steps (None before any step ran)."""
        if not self._steps:
            return None
        recent = list(self._steps)[-RECENT_STEPS:]
        return sum(step[0] for step in recent) / len(recent)

    @property
    def layer_seconds(self) -> float:
        """The cost of one more streamed layer in the recent steps: timed where enough layers were, else fitted
        (never below zero: a copy is not a speed-up)."""
        return self.layer_seconds_at(self.recent_tokens) if self.timed else self._coefficients()[0]

    @property
    def row_seconds(self) -> float:
        """The fitted cost of one more decoding sequence per step (never below zero)."""
        return self._coefficients()[1]

    @property
    def token_seconds(self) -> float | None:
        """The fitted cost of one more token in a step (a prompt token: what recomputing one costs; never below
        zero), or None while every step seen decoded only (a token and a row cannot be told apart then)."""
        return self._coefficients()[2]

    def decode_seconds(self, rows: float, streamed: int) -> float | None:
        """The fitted time of a decode-only step of ``rows`` sequences with ``streamed`` layers streamed (None before
        enough steps were timed to fit one)."""
        layer, row, _, intercept = self._coefficients()
        if intercept is None:
            return None
        if self.timed:
            layer = self.layer_seconds_at(rows)
        return max(0.0, intercept + row * rows + layer * streamed)

    def predict_next(self, extra_rows: float = 0.0, now: float | None = None) -> float | None:
        """The step time with one more layer streamed and ``extra_rows`` more sequences decoding, from
        ``now`` (default: the recent steps' mean; None before any step ran)."""
        now = self.recent_seconds if now is None else now
        if now is None:
            return None
        if not self.timed:
            return now + self.layer_seconds + extra_rows * self.row_seconds
        # timed layers cost more with more rows: the new layer at the recent steps' tokens plus the admitted rows,
        # and the layers already offloaded as much more as those rows add to each
        tokens = self.recent_tokens + extra_rows
        grown = self.layer_seconds_at(tokens) - self.layer_seconds_at(self.recent_tokens)
        return now + self.layer_seconds_at(tokens) + extra_rows * self.row_seconds + self.streamed * grown

    @property
    def recent_tokens(self) -> float:
        """Mean tokens of the last ``RECENT_STEPS`` steps (0 before any step ran)."""
        recent = list(self._steps)[-RECENT_STEPS:]
        return sum(step[1] for step in recent) / len(recent) if recent else 0.0

    def _coefficients(self) -> tuple[float, float, float | None, float | None]:
        if self._fit is None:
            self._fit = self._solve()
        return self._fit

    def _solve(self) -> tuple[float, float, float | None, float | None]:
        """(layer, row, prompt token, intercept): the coefficients of the fit; no token cost while every step
        decoded only, no intercept before 4 steps."""
        if len(self._steps) < 4:
            return self.prior, 0.0, None, None
        data = np.asarray(self._steps, dtype=np.float64)
        y = data[:, 0]
        x = np.column_stack((np.ones(len(data)), data[:, 1], data[:, 2], data[:, 3]))
        # the pseudo-row speaks for prior_weight steps one streamed layer apart
        w = np.sqrt(self.prior_weight)
        x = np.vstack((x, [0.0, 0.0, 0.0, w]))
        y = np.append(y, w * self.prior)
        coef, *_ = np.linalg.lstsq(x, y, rcond=None)
        # a decode row is one token and one sequence; min-norm splits b and c when every step decodes only
        prompts = bool((data[:, 1] != data[:, 2]).any())
        return max(0.0, float(coef[3])), max(0.0, float(coef[1] + coef[2])), \
            max(0.0, float(coef[1])) if prompts else None, float(coef[0])
