"""Speculation with tensor parallelism: rank 0 drafts (n-gram, or a draft that runs unsharded on rank 0: a draft
model, an EAGLE-3 head reading rank 0's captured hidden states and the whole embedding matrix, an MTP layer) and
verifies; the workers compute the verifying step's positions from the host step it sends them. Greedy tokens equal
TP=2 without speculation (batch-invariant), and every rank books the draft rank 0 holds (the same plan, the same
KV blocks)."""
import pytest

from gh200rt.config import EngineConfig
from gh200rt.engine.engine import LLMEngine
from gh200rt.engine.llm import LLM
from gh200rt.sampling_params import SamplingParams
from tests.distributed.tiny_tp_models import save_tp_tiny
from tests.model.tiny_checkpoints import save_tiny
from tests.speculative.eagle3_files import write_eagle3_head
from tests.speculative.test_mtp import add_mtp_layer
from tests.speculative.test_spec_engine import NGRAM, looping_prompts


def run(path: str, prompts, max_tokens: int = 16, **options) -> tuple[list, object, dict]:
    """(tokens of each prompt, rank 0's engine stats, each rank's ledger once stopped)."""
    config = EngineConfig.from_kwargs(model=path, dtype="float32", max_model_len=128, tensor_parallel_size=2,
                                      batch_invariant=True, **options)
    llm = LLM.from_engine(LLMEngine.from_config(config))
    try:
        out = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True))
        stats = llm.engine.stats()
        ledgers = {0: dict(llm.engine.ledger.by_kind)}
    finally:
        llm.engine.close()
    ledgers.update({rank: report["ledger"] for rank, report in llm.engine.parallel.final_reports.items()})
    return [o.outputs[0].token_ids for o in out], stats, ledgers


def test_two_ranks_verify_what_one_drafts(tmp_path):
    """And with --async-scheduling (with or without drafts, rank 0 launches the next step once a step is taken in,
    before it is reported): the same tokens."""
    path = save_tp_tiny("llama-gqa", str(tmp_path / "llama"))
    prompts = looping_prompts(4, seed=12)
    want, _, _ = run(path, prompts)
    got, stats, _ = run(path, prompts, speculative_config=NGRAM)
    assert got == want
    assert stats.spec_decode.num_accepted_tokens > 0, stats
    got, stats, _ = run(path, prompts, speculative_config=NGRAM, async_scheduling=True)
    assert got == want and stats.steps_launched_ahead > 0 and stats.spec_decode.num_accepted_tokens > 0, stats
    assert run(path, prompts, async_scheduling=True)[0] == want


def booked_alike(ledgers: dict) -> None:
    """Every rank booked rank 0's draft: its weights and its KV beside the same pool."""
    assert ledgers[0]["draft_weights"] > 0 and ledgers[0]["draft_kv"] > 0
    for rank in (1,):
        for kind in ("draft_weights", "draft_kv", "kv_pool"):
            assert ledgers[rank][kind] == ledgers[0][kind], (rank, kind, ledgers)


def test_a_draft_model_and_an_eagle3_head_draft_on_rank_zero(tmp_path):
    path = save_tp_tiny("llama-gqa", str(tmp_path / "llama"))
    prompts = looping_prompts(2, seed=7)
    want, _, _ = run(path, prompts, max_tokens=12)
    # the draft is the target itself, unsharded: its drafts are (up to the last bits) the target's
    draft = {"method": "draft_model", "model": path, "num_speculative_tokens": 3}
    got, stats, ledgers = run(path, prompts, max_tokens=12, speculative_config=draft)
    assert got == want
    assert stats.spec_decode.num_accepted_tokens > 0, stats
    booked_alike(ledgers)
    # a head sharing the target's embeddings: rank 0 holds a vocabulary half, so the head reads the whole matrix
    head = write_eagle3_head(str(tmp_path / "head"), aux_ids=[0, 1, 1], draft_vocab=256)
    eagle3 = {"method": "eagle3", "model": head, "num_speculative_tokens": 2}
    got, stats, ledgers = run(path, prompts, max_tokens=12, speculative_config=eagle3)
    assert got == want
    assert stats.spec_decode.num_draft_tokens > 0, stats
    booked_alike(ledgers)
    assert ledgers[0]["draft_weights"] >= 256 * 64 * 4       # the embeddings are the head's own on rank 0


@pytest.mark.parametrize("family", ["deepseek-v3"])
def test_an_mtp_layer_drafts_on_rank_zero(tmp_path, family):
    path = str(tmp_path / family)
    save_tiny(family, path)
    add_mtp_layer(path)
    prompts = looping_prompts(2, seed=3)
    want, _, _ = run(path, prompts, max_tokens=12)
    got, stats, ledgers = run(path, prompts, max_tokens=12,
                              speculative_config={"method": "mtp", "num_speculative_tokens": 2})
    assert got == want
    assert stats.spec_decode.num_draft_tokens > 0, stats
    booked_alike(ledgers)
