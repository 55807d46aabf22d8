"""Timing that compares like with like: candidates measured in alternating rounds of one process, and a CUDA
kernel's median time.

On a shared machine the load drifts by more than most changes measured here; ``alternate`` runs every candidate
once per round, in the opposite order every other round, so drift and the cost of going first fall on all of them
alike. Each candidate measures what it measures (a call's seconds, a decode rate, a step time) and returns it; the
caller takes the median (``median``) or the best round (``min`` / ``max``), whichever its figure is.
"""
from __future__ import annotations

import time
from typing import Callable, Mapping, TypeVar

T = TypeVar("T")
SLOW_CALL_MS = 50.0     # a GPU call slower than this is timed once (``timed``)


def alternate(candidates: Mapping[str, Callable[[int], T]], rounds: int,
              after_round: Callable[[int], None] | None = None) -> dict[str, list[T]]:
    """Every candidate's results in round order: ``candidates[name](round)`` once per round, the order reversed on
    odd rounds; ``after_round(round)`` after each (a progress line)."""
    results: dict[str, list[T]] = {name: [] for name in candidates}
    order = list(candidates)
    for r in range(rounds):
        for name in (order if r % 2 == 0 else order[::-1]):
            results[name].append(candidates[name](r))
        if after_round is not None:
            after_round(r)
    return results


def seconds_of(fn: Callable[[], T]) -> tuple[float, T]:
    """(wall seconds of one call of ``fn``, what it returned)."""
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def timed(fn) -> tuple[float, object]:
    """(median ms of the CUDA work ``fn`` launches, its output): ``triton.testing.do_bench`` with the L2 flushed
    between calls, after a compiling call. A call slower than ``SLOW_CALL_MS`` is timed once (CUDA events): the
    per-element scale loads of older kernels take seconds per call on the largest layers."""
    import torch
    import triton.testing
    out = fn()                             # compiles
    torch.cuda.synchronize()
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    fn()
    end.record()
    end.synchronize()
    once = begin.elapsed_time(end)
    if once > SLOW_CALL_MS:
        return once, out
    return triton.testing.do_bench(fn, warmup=10, rep=50, return_mode="median"), out
