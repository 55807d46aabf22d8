"""How fast the engine decodes, measured on the engine itself: the decode rate over decode-only steps after a
prefill, a decode step's median time, and the rate the platform profile's bandwidths allow (the roofline), for the
weight placements ``latency`` compares."""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

from gh200rt.engine.engine import LLMEngine
from gh200rt.planner.cost_model import direct_layer_seconds, expert_seconds
from gh200rt.sampling_params import SamplingParams


def placements(num_layers: int) -> dict[str, dict]:
    """Layer placements, and for an MoE model the routed experts' (``experts-*``: layers resident)."""
    every = lambda g: ",".join(f"{i}:streamed" for i in range(g - 1, num_layers, g))  # noqa: E731
    half = ",".join(f"{i}:experts=direct" for i in range(1, num_layers, 2))
    return {"resident": dict(offload="none"),
            "stream": dict(offload="stream", staging_slots=2, prefetch_distance=1),
            "every-2nd": dict(offload="none", layer_tiers=every(2), staging_slots=2, prefetch_distance=1),
            "every-4th": dict(offload="none", layer_tiers=every(4), staging_slots=2, prefetch_distance=1),
            "direct": dict(offload="direct"),
            "direct-host-scales": dict(offload="direct", direct_scales="host"),   # quantized: scales beside codes
            "experts-direct": dict(offload="none", moe_expert_tier="direct"),
            "experts-stream": dict(offload="none", moe_expert_tier="stream"),
            "experts-cpu": dict(offload="none", moe_expert_tier="cpu"),
            "experts-half-direct": dict(offload="none", moe_expert_tier="resident", layer_tiers=half)}


MOE_PLACEMENTS = ("experts-direct", "experts-stream", "experts-cpu", "experts-half-direct")
DEFAULT_PLACEMENTS = "resident,stream,every-2nd,every-4th,direct"


@dataclass(frozen=True)
class DecodeRate:
    tokens_per_second: float
    copy_gbps: float
    copy_wait_ms_per_step: float
    captures: int            # decode graphs captured inside the timed steps (0 once warm_up ran)
    expert_link_bytes_per_step: float = 0.0    # routed experts copied in or read in place, per decode step


def prompt_of(i: int, context: int) -> list[int]:
    """Request ``i``'s prompt: four tokens, or ``context`` (its first token its own, so no two share a cached
    prefix)."""
    return [1 + i, 17, 42, 99] + [100 + (7 * j + i) % 900 for j in range(max(0, context - 4))]


def prefill(engine: LLMEngine) -> None:
    """Step until every request has its first token: a long prompt takes several steps (chunked prefill), during
    which the requests prefilled first already decode."""
    engine.step()
    while engine.scheduler.waiting or any(not seq.output_token_ids and not seq.is_finished
                                          for seq in engine.scheduler.running):
        engine.step()


def decode_rate(engine: LLMEngine, batch: int, tokens: int, host_profile=None, context: int = 4) -> DecodeRate:
    """Decode rate over the decode steps of ``batch`` requests of ``tokens`` new tokens each after prompts of
    ``context`` tokens; ``host_profile``: a ``cProfile.Profile`` to run over those steps (the rate then includes
    its overhead)."""
    params = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
    for i in range(batch):
        engine.add_request(f"b{batch}-{i}", None, params, prompt_token_ids=prompt_of(i, context))
    prefill(engine)  # prefill of every request (+ their first token)
    # with async scheduling that call launched the first decode step too: finish it untimed and leave its tokens out
    ahead = engine.rows_in_flight
    if ahead and str(engine.runner.device).startswith("cuda"):
        import torch
        torch.cuda.synchronize()
    before = engine.stats()
    generated, steps = engine.generation_tokens + ahead, 0
    start = time.perf_counter()
    if host_profile is not None:
        host_profile.enable()
    while engine.has_unfinished_requests():
        engine.step()
        steps += 1
    if host_profile is not None:
        host_profile.disable()
    seconds = time.perf_counter() - start
    after = engine.stats()
    expert_bytes = (after.expert_bytes_copied - before.expert_bytes_copied
                    + after.expert_bytes_read_direct - before.expert_bytes_read_direct)
    return DecodeRate((engine.generation_tokens - generated) / seconds,
                      (after.weight_bytes_copied - before.weight_bytes_copied) / seconds / 1e9,
                      (after.copy_wait_seconds - before.copy_wait_seconds) / max(steps, 1) * 1e3,
                      after.graph_captures - before.graph_captures, expert_bytes / max(steps, 1))


def whole_layer_expert_bytes(engine: LLMEngine) -> int:
    """What one decode step would copy if every MoE layer with an offloaded expert streamed all its experts:
    the bytes a routed-experts-only placement is compared with."""
    sizes = engine.plan.sizes
    offloaded = sum(1 for tiers in engine.store.expert_tiers.values() if any(t != "resident" for t in tiers))
    return offloaded * sizes.num_experts * sizes.host_expert_bytes


def warm_up(engine: LLMEngine, batches: list[int]) -> None:
    """One decode step at every batch size the run will time: first-call costs (compiles, first touch,
    allocator) and the lazy capture of each batch's decode graph (on a GPU) stay out of the timed steps."""
    for batch in batches:
        decode_rate(engine, batch, 2)


def step_ms(engine: LLMEngine, batch: int, tokens: int, prompts: list[list[int]] | None = None) -> float:
    """Median decode-step time in ms (the time between tokens) of ``batch`` requests of ``tokens`` tokens
    (``prompts``: one per request, default four tokens each; together they must fit one step's token budget)."""
    params = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
    for i in range(batch):
        prompt = prompts[i] if prompts is not None else [1 + i, 17, 42, 99]
        engine.add_request(f"t{batch}-{i}", None, params, prompt_token_ids=prompt)
    engine.step()  # prefill of every request (+ their first token)
    times = []
    while engine.has_unfinished_requests():
        start = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def roofline_tokens_per_second(engine: LLMEngine, batch: int, kv_tokens: float = 0.0) -> float:
    """Decode tokens/s allowed by the platform profile's bandwidths for the plan's weight bytes per step; an MoE
    model's routed experts count as the expected distinct experts a step of ``batch`` tokens touches, each at
    its tier's cost (cost_model.expert_seconds). ``kv_tokens``: the cached positions each sequence's attention
    reads per step on average (``--context``), whose K/V bytes count at the device's bandwidth too."""
    plan, platform = engine.plan, engine.platform
    sizes = plan.sizes
    streamed = sizes.host_bytes(plan.streamed_layers)
    dense_resident = sizes.fixed_memory + sizes.resident_memory(plan.resident_layers)
    kv = batch * kv_tokens * sizes.kv_bytes_per_token
    compute = ((dense_resident + streamed + kv) / (platform.hbm_gbps * 1e9)
               + sum(direct_layer_seconds(sizes.layers[i], platform, plan.direct_scales_on_device)
                     for i in plan.direct_layers))
    step = max(compute, streamed / (platform.link_h2d_gbps * 1e9)) + \
        expert_seconds(plan.expert_tiers, sizes, platform, batch)
    return batch / step
