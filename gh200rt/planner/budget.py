"""The smallest device budget a set of options plans in, and the refusal that names it.

Contract: ``smallest_layout(...)`` finds the least capacity that ``Layout.fits`` accepts for the layout
``layout_for`` picks at that capacity: the code ``make_plan`` accepts with, searched over the budget, so the
minimum a refusal names is accepted to the byte and a byte less is refused. The search bisects, which is exact
because acceptance is monotone in the budget: fixed tiers (``none``, ``stream``, ``direct``) need the same bytes
at any budget, and ``auto`` / ``dynamic`` accept a budget exactly when some count of streamed layers fits it.
(``--layer-tiers`` over ``auto`` could break that; the bisection still returns an accepted budget whose byte
less is refused.)
"""
from __future__ import annotations

import dataclasses

from gh200rt.config import MemoryConfig
from gh200rt.planner.cost_model import ModelSizes
from gh200rt.planner.layout import DEFAULT_STAGING_SLOTS, EXPERT_STAGING_SLOTS, Layout, layout_for, planning_sizes
from gh200rt.platform.detect import Platform


class PlanDoesNotFit(ValueError):
    """No placement fits the device budget; the message names the minimum that would (``minimum``)."""

    def __init__(self, message: str, minimum: int):
        super().__init__(message)
        self.minimum = minimum


def _gib(nbytes: int) -> str:
    return f"{nbytes / (1 << 30):.3f} GiB"


def smallest_layout(sizes: ModelSizes, platform: Platform, memory: MemoryConfig, block_size: int,
                    activation_bytes: int, kv_min_tokens: int) -> tuple[int, Layout]:
    """(the smallest accepted budget, the layout at it)."""
    planned = planning_sizes(sizes, memory, platform, block_size)

    def at(capacity: int) -> Layout:
        return layout_for(planned, platform, memory, capacity, block_size, activation_bytes, kv_min_tokens)

    # no layout needs more: every layer resident (route forms included) beside the largest ring the options allow
    hi = planned.all_resident_bytes + (memory.staging_slots or DEFAULT_STAGING_SLOTS) * planned.host_layer_bytes + \
        EXPERT_STAGING_SLOTS * planned.host_expert_bytes + activation_bytes + at(0).kv_min_bytes
    assert at(hi).fits(hi), (hi, at(hi))
    lo = 0                              # refused: the KV cache needs at least one block
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if at(mid).fits(mid):
            hi = mid
        else:
            lo = mid
    return hi, at(hi)


def _cheaper_options(memory: MemoryConfig) -> dict[str, MemoryConfig]:
    """Other offload options that may plan in less: no ring at all (direct, its scales left on the host too), or
    the smallest ring (stream K=1)."""
    direct = dataclasses.replace(memory, offload="direct", layer_tiers=None)
    return {"--offload direct": direct,
            "--offload direct --direct-scales host": dataclasses.replace(direct, direct_scales="host"),
            "--offload stream --staging-slots 1 --prefetch-distance 0": dataclasses.replace(
                memory, offload="stream", layer_tiers=None, staging_slots=1, prefetch_distance=0)}


def budget_refusal(sizes: ModelSizes, platform: Platform, memory: MemoryConfig, capacity: int,
                   block_size: int, activation_bytes: int, kv_min_tokens: int) -> PlanDoesNotFit:
    """Why ``capacity`` is refused (its layout does not fit it), and the smallest budget that is not."""
    refused = layout_for(planning_sizes(sizes, memory, platform, block_size), platform, memory, capacity,
                         block_size, activation_bytes, kv_min_tokens)
    assert not refused.fits(capacity), (capacity, refused)
    minimum, smallest = smallest_layout(sizes, platform, memory, block_size, activation_bytes, kv_min_tokens)
    options = f"--offload {memory.offload}" + (f" --layer-tiers {memory.layer_tiers}" if memory.layer_tiers else "")
    cheaper, named = [], set()
    for flags, other in _cheaper_options(memory).items():
        if other == memory:
            continue
        other_minimum, _ = smallest_layout(sizes, platform, other, block_size, activation_bytes, kv_min_tokens)
        if other_minimum < minimum and other_minimum not in named:   # the same need under other flags says nothing
            named.add(other_minimum)
            cheaper.append(f"{flags} needs {other_minimum} bytes ({_gib(other_minimum)})")
    return PlanDoesNotFit(
        f"device budget {capacity} bytes ({_gib(capacity)}) is too small for {options}: with "
        f"{refused.describe()} the weights on the device need {refused.weight_bytes} bytes, activations "
        f"{activation_bytes} and the KV cache at least {refused.kv_min_bytes} ({refused.kv_min_blocks * block_size} "
        f"tokens: one --max-model-len sequence, or --kv-cache-min-tokens); the smallest plan {options} makes "
        f"({smallest.describe()}) needs {minimum} bytes ({_gib(minimum)})"
        + (f"; {', '.join(cheaper)}" if cheaper else "")
        + ". Raise --device-memory-budget, or lower --max-model-len, --kv-cache-min-tokens or "
          "--max-num-batched-tokens", minimum)
