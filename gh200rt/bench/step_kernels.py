"""What one decode step runs on the device (``latency --kernel-times``) and where the host's share of a step goes
(``latency --host-profile``)."""
from __future__ import annotations

import os
from dataclasses import dataclass

from gh200rt.bench.decode_rate import decode_rate, prefill, prompt_of
from gh200rt.engine.engine import LLMEngine
from gh200rt.launch_count import counting_launches
from gh200rt.sampling_params import SamplingParams


@dataclass(frozen=True)
class StepKernels:
    """What one decode step ran on the device: ``count`` kernels and copies (elsewhere the launches issued).
    On a GPU also their summed device time, the span from the first one's start to the last one's end (the
    difference is the device idle between them: launch gaps, host waits), and the costliest kernel names as
    (name, calls, microseconds), most first."""
    count: int | None
    busy_us: float | None = None
    span_us: float | None = None
    costliest: tuple[tuple[str, int, float], ...] = ()


def step_kernels(engine: LLMEngine, batch: int, context: int = 4) -> StepKernels:
    """Kernels one decode step of ``batch`` requests runs: on a GPU the device kernels and copies the profiler
    records (CUDA-graph replays included), with their times; elsewhere the launches the same code issues
    (gh200rt/launch_count.py: torch ops that do work, Triton launches)."""
    # six tokens: with async scheduling the counted step() must still launch a decode step (one that samples the
    # fourth token), not only report the last one
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    for i in range(batch):
        engine.add_request(f"k{batch}-{i}", None, params, prompt_token_ids=prompt_of(i, context))
    prefill(engine)
    engine.step()  # a first decode step: a graph's capture stays out of the counted one
    if str(engine.runner.device).startswith("cuda"):
        result = _profiled_step(engine)
    else:
        with counting_launches() as launches:
            engine.step()
        result = StepKernels(launches.total)
    while engine.has_unfinished_requests():
        engine.step()
    return result


def _profiled_step(engine: LLMEngine) -> StepKernels:
    import torch
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    try:
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            engine.step()
            torch.cuda.synchronize()
    except RuntimeError as err:      # no CUPTI here: the decode figures stand without the count
        print(f"kernels per step not counted: the profiler failed ({err})", flush=True)
        return StepKernels(None)
    device = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    if not device:
        return StepKernels(0)
    by_name: dict[str, list] = {}
    for e in device:
        entry = by_name.setdefault(e.name, [0, 0.0])
        entry[0] += 1
        entry[1] += e.time_range.elapsed_us()
    span = max(e.time_range.end for e in device) - min(e.time_range.start for e in device)
    costliest = sorted(((name, calls, us) for name, (calls, us) in by_name.items()), key=lambda r: -r[2])
    return StepKernels(len(device), sum(us for _, _, us in costliest), span, tuple(costliest))


def print_host_profile(engine: LLMEngine, batch: int, tokens: int, top: int, context: int = 4) -> None:
    """``--host-profile``: the decode steps of another ``batch`` x ``tokens`` run under cProfile, then the ``top``
    functions by their own time per step (where the host's share of a step goes)."""
    import cProfile
    import pstats
    profile = cProfile.Profile()
    rate = decode_rate(engine, batch, tokens, profile, context)
    stats = pstats.Stats(profile)
    steps = max(1, tokens - 1)         # the prefill step samples each request's first token
    print(f"    host profile over {steps} steps ({batch / rate.tokens_per_second * 1e3:.3f} ms a step profiled), "
          f"own time per step:")
    rows = sorted(stats.stats.items(), key=lambda item: -item[1][2])[:top]
    for (path, line, name), (_, calls, own, cumulative, _) in rows:
        print(f"    {own / steps * 1e3:8.3f} ms own {cumulative / steps * 1e3:8.3f} ms with callees {calls / steps:7.1f}x"
              f"  {os.path.basename(path)}:{line}({name})")


def print_step_kernels(kernels: StepKernels, step_ms: float, top: int) -> None:
    """The ``--kernel-times`` lines under a row: busy and idle device time in a step, then the costliest kernels."""
    if kernels.busy_us is None:
        return
    print(f"    {kernels.count} kernels: {kernels.busy_us / 1e3:.3f} ms busy over a {kernels.span_us / 1e3:.3f} ms span "
          f"(step {step_ms:.3f} ms timed; {1 - kernels.busy_us / max(kernels.span_us, 1e-9):.0%} of the span idle)")
    for name, calls, us in kernels.costliest[:top]:
        print(f"    {us / 1e3:8.3f} ms {us / kernels.busy_us:5.1%} {calls:>5}x  {name[:90]}")
