"""N-gram speculation with tensor parallelism: rank 0 drafts and verifies, the workers compute the verifying step's
positions from the host step it sends them; greedy tokens equal TP=2 without speculation (batch-invariant)."""
from gh200rt.config import EngineConfig
from gh200rt.engine.engine import LLMEngine
from gh200rt.engine.llm import LLM
from gh200rt.sampling_params import SamplingParams
from tests.distributed.tiny_tp_models import save_tp_tiny
from tests.speculative.test_spec_engine import NGRAM, looping_prompts


def run(path: str, prompts, **options) -> tuple[list, object]:
    config = EngineConfig.from_kwargs(model=path, dtype="float32", max_model_len=128, tensor_parallel_size=2,
                                      batch_invariant=True, **options)
    llm = LLM.from_engine(LLMEngine.from_config(config))
    try:
        out = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=16, ignore_eos=True))
        return [o.outputs[0].token_ids for o in out], llm.engine.stats().spec_decode
    finally:
        llm.engine.close()


def test_two_ranks_verify_what_one_drafts(tmp_path):
    path = save_tp_tiny("llama-gqa", str(tmp_path / "llama"))
    prompts = looping_prompts(4, seed=12)
    want, _ = run(path, prompts)
    got, stats = run(path, prompts, speculative_config=NGRAM)
    assert got == want
    assert stats.num_accepted_tokens > 0, stats
