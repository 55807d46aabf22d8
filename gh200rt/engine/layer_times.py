"""What the offloaded decoder layers of a step cost beyond resident ones, timed where the host runs the step.

The tier controller prices a demotion by what one more offloaded layer adds to every step. A least-squares fit of
step time over a burst cannot answer that: the batch grows while layers stream, and the fit puts the layers' cost on
the rows (on a Zen 5 the fitted cost of a streamed layer fell from 0.71 to 0 ms while one measured 0.6-1.4 ms a step).
On the CPU platform the step is synchronous, so a layer's wall time between the model runner's hooks is its cost:
``TimedLayers`` wraps a step's hooks and times each layer that runs between them (the hooks' own work, the copy wait
and the staging ring's next copies, is part of an offloaded layer's time: a resident layer's hooks do nothing), and
``LayerTimes.record`` turns a step's times into the *excess* of its offloaded layers, their time beyond the mean of
the same step's resident layers. A step whose layers ran in one call (nothing offloaded) has no excess. A step with
no resident layer is compared with the last resident mean measured.

What the per-layer times leave out: a resident layer computing while the copy thread reads a host slab runs a
little slower (they share the cores); that slowdown is not counted as the offloaded layers' cost.
"""
from __future__ import annotations

import time
from typing import Callable

from gh200rt.weights.schedule import ForwardingHooks, LayerHooks


class LayerTimes:
    """The excess of the offloaded layers in the steps since the last ``take``; ``offloaded(i)``: whether layer i
    is offloaded now (streamed or direct)."""

    def __init__(self, offloaded: Callable[[int], bool]):
        self.offloaded = offloaded
        self._excess = 0.0
        self._samples: list[tuple[float, int]] = []
        self._resident_mean: float | None = None

    def timing(self, hooks: LayerHooks, tokens: int) -> "TimedLayers":
        """``hooks`` with each decoder layer of a step of ``tokens`` tokens timed."""
        return TimedLayers(hooks, self, tokens)

    def record(self, tokens: int, offloaded: list[float], resident: list[float]) -> None:
        """One step's layer times: those of its offloaded layers and of its resident ones."""
        if resident:
            self._resident_mean = sum(resident) / len(resident)
        if not offloaded or self._resident_mean is None:
            return
        excess = sum(offloaded) - len(offloaded) * self._resident_mean
        self._excess += excess
        self._samples.append((excess / len(offloaded), tokens))

    def take(self) -> tuple[float, tuple[tuple[float, int], ...]]:
        """``(excess, samples)`` since the last call: the seconds the offloaded layers took beyond resident ones in
        all those steps, and per step that had one, ``(excess of one offloaded layer, the step's tokens)``."""
        taken = (self._excess, tuple(self._samples))
        self._excess, self._samples = 0.0, []
        return taken


class TimedLayers(ForwardingHooks):
    """``hooks`` with the wall time of every decoder layer run between them kept for ``LayerTimes.record``."""

    def __init__(self, hooks: LayerHooks, times: LayerTimes, tokens: int):
        self.hooks, self.times, self.tokens = hooks, times, tokens
        self._start = 0.0
        self._offloaded: list[float] = []
        self._resident: list[float] = []

    def inner_hooks(self) -> LayerHooks:
        return self.hooks

    def before_layer(self, index: int) -> None:
        self._start = time.perf_counter()
        self.hooks.before_layer(index)

    def after_layer(self, index: int) -> None:
        self.hooks.after_layer(index)
        seconds = time.perf_counter() - self._start
        (self._offloaded if self.times.offloaded(index) else self._resident).append(seconds)

    def finish(self) -> None:
        """The step ran: hand its layer times to ``LayerTimes``."""
        self.times.record(self.tokens, self._offloaded, self._resident)
