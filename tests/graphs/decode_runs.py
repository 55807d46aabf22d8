"""Drive an engine through every decode batch bucket: 24 prompts whose max_tokens are 1..24, so once all
are admitted the decode batch shrinks 24, 23, ..., 1 and passes every bucket, padded and exact."""
from __future__ import annotations

from gh200rt.config import EngineConfig
from gh200rt.engine.engine import LLMEngine
from gh200rt.engine.llm import LLM
from gh200rt.sampling_params import SamplingParams

MAX_BATCH = 24
BUCKETS = [1, 2, 4, 8, 16, 24]
LAYERS = 6


def prompts(count: int = MAX_BATCH) -> list[list[int]]:
    return [[(7 * i + j) % 250 + 3 for j in range(3 + i % 11)] for i in range(count)]


def make_engine(model_dir: str, graphs: bool, poison: bool = True, **options) -> LLMEngine:
    config = EngineConfig.from_kwargs(model=model_dir, dtype="float32", max_model_len=128, num_kv_blocks=96,
                                      max_num_seqs=MAX_BATCH, enforce_eager=not graphs,
                                      max_graph_batch=MAX_BATCH, **options)
    return LLMEngine.from_config(config, poison=poison)


def generate(engine: LLMEngine, count: int = MAX_BATCH) -> list[tuple[list[int], list]]:
    """(token ids, logprobs) per prompt; prompt i generates i + 1 tokens."""
    params = [SamplingParams(temperature=0, max_tokens=i + 1, ignore_eos=True, logprobs=3) for i in range(count)]
    outs = LLM.from_engine(engine).generate(prompts(count), params)
    return [(o.outputs[0].token_ids, [sorted(lp.items()) for lp in o.outputs[0].logprobs]) for o in outs]
