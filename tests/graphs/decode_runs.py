"""Drive an engine through every decode batch bucket: 24 prompts whose max_tokens are 1..24, so once all
are admitted the decode batch shrinks 24, 23, ..., 1 and passes every bucket, padded and exact."""
from __future__ import annotations

from gh200rt.config import EngineConfig
from gh200rt.engine.engine import LLMEngine
from gh200rt.engine.llm import LLM
from gh200rt.engine.outputs import RequestOutput
from gh200rt.sampling_params import SamplingParams

MAX_BATCH = 24
BUCKETS = [1, 2, 4, 8, 16, 24]
LAYERS = 6
EVERY_2ND = ",".join(f"{i}:streamed" for i in range(1, LAYERS, 2))
# every placement the graph path must keep: the ring at depths 1-3, streamed beside resident, direct
PLACEMENTS = {
    "resident": dict(offload="none"),
    "stream K1 d0": dict(offload="stream", staging_slots=1, prefetch_distance=0),
    "stream K2 d1": dict(offload="stream", staging_slots=2, prefetch_distance=1),
    "stream K3 d2": dict(offload="stream", staging_slots=3, prefetch_distance=2),
    "every 2nd streamed": dict(offload="none", layer_tiers=EVERY_2ND, staging_slots=2, prefetch_distance=1),
    "direct": dict(offload="direct"),
    "direct + streamed": dict(offload="direct", layer_tiers="0-2:streamed", staging_slots=2, prefetch_distance=1),
}


def prompts(count: int = MAX_BATCH) -> list[list[int]]:
    return [[(7 * i + j) % 250 + 3 for j in range(3 + i % 11)] for i in range(count)]


def make_engine(model_dir: str, graphs: bool, poison: bool = True, dtype: str = "float32", **options) -> LLMEngine:
    config = EngineConfig.from_kwargs(model=model_dir, dtype=dtype, max_model_len=128, num_kv_blocks=96,
                                      max_num_seqs=MAX_BATCH, enforce_eager=not graphs,
                                      max_graph_batch=MAX_BATCH, **options)
    return LLMEngine.from_config(config, poison=poison)


def generate_outputs(engine: LLMEngine, count: int = MAX_BATCH) -> list[RequestOutput]:
    """Prompt i generates i + 1 tokens, greedily, with 3 logprobs per token."""
    params = [SamplingParams(temperature=0, max_tokens=i + 1, ignore_eos=True, logprobs=3) for i in range(count)]
    return LLM.from_engine(engine).generate(prompts(count), params)


def generate(engine: LLMEngine, count: int = MAX_BATCH) -> list[tuple[list[int], list]]:
    """(token ids, logprobs) per prompt of ``generate_outputs``."""
    outs = generate_outputs(engine, count)
    return [(o.outputs[0].token_ids, [sorted(lp.items()) for lp in o.outputs[0].logprobs]) for o in outs]


def staggered(engine: LLMEngine, steps: int = 40, arrivals: tuple[int, ...] = (4, 9, 15, 22)) -> list[RequestOutput]:
    """Two requests decode while others arrive at the given steps: their prefills run eagerly between the
    decode steps' replays. The same arrivals on any engine give the same schedule."""
    params = SamplingParams(temperature=0, max_tokens=14, ignore_eos=True, logprobs=3)
    waiting = {step: i for i, step in enumerate(arrivals, start=2)}
    for i in range(2):
        engine.add_request(str(i), None, params, prompt_token_ids=prompts(8)[i])
    final = {}
    for step in range(steps):
        if step in waiting:
            i = waiting[step]
            engine.add_request(str(i), None, params, prompt_token_ids=prompts(8)[i])
        for out in engine.step():
            if out.finished:
                final[out.request_id] = out
    assert not engine.has_unfinished_requests()
    return [final[str(i)] for i in range(2 + len(arrivals))]
