"""Embedding requests in the engine over the toy model: a mean-pooled input preempted mid-prefill (and prefilled
again from its first token) pools the same vector as alone; an aborted one frees its blocks and answers nothing."""
import torch

from gh200rt.config import EngineConfig
from gh200rt.engine.engine import LLMEngine
from gh200rt.pooling_params import PoolingParams
from gh200rt.sampling_params import SamplingParams
from tests.engine.toy_model import ToyArch, ToyModel, ToyTokenizer

IDS = list(range(3, 33))


def engine(**options) -> LLMEngine:
    arch = ToyArch(max_position_embeddings=48)
    cfg = EngineConfig.from_kwargs(block_size=4, max_model_len=48, pooling_type="MEAN", enable_prefix_caching=False,
                                   **options)
    return LLMEngine(ToyModel(arch), ToyTokenizer(), arch, cfg)


def run(e: LLMEngine) -> dict:
    outputs = {}
    while e.has_unfinished_requests():
        for out in e.step():
            outputs[out.request_id] = out
    return outputs


def test_preempted_mean_pooling_starts_over():
    alone = engine(num_kv_blocks=64)
    alone.add_request("e", None, PoolingParams(), prompt_token_ids=IDS)
    want = torch.tensor(run(alone)["e"].outputs.embedding)
    e = engine(num_kv_blocks=12, max_num_batched_tokens=8)     # the generation's 46 tokens and the input's 30 do not fit
    e.add_request("g", None, SamplingParams(max_tokens=30, ignore_eos=True), prompt_token_ids=[5] * 16)
    e.add_request("e", None, PoolingParams(), prompt_token_ids=IDS)
    got = torch.tensor(run(e)["e"].outputs.embedding)
    assert e.scheduler.num_preemptions > 0
    assert torch.allclose(got, want, rtol=0, atol=1e-6), float((got - want).abs().max())


def test_abort_frees_blocks():
    e = engine(num_kv_blocks=64, max_num_batched_tokens=8)
    e.add_request("e", None, PoolingParams(), prompt_token_ids=IDS)
    assert e.step() == []                     # first chunk of 8: nothing to answer yet
    assert e.kv.pool.num_free < 64
    e.abort("e")
    assert not e.has_unfinished_requests() and e.kv.pool.num_free == 64 and run(e) == {}
