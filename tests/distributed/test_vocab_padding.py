"""A vocabulary that N does not divide (251 over two ranks): each rank holds 126 rows of the embedding and LM head,
the last one zeros that pad it; TP=2 greedy tokens and logprobs equal TP=1's in float32 and no padded id is ever
sampled (rank 0 cuts the padding's logits off after the gather)."""
from __future__ import annotations

import pytest

from gh200rt.distributed.launch import usable_cores
from gh200rt.sampling_params import SamplingParams
from tests.distributed.tiny_tp_models import save_tp_tiny, tp_llm
from tests.engine.real_models import assert_same_or_near_tie

pytestmark = pytest.mark.skipif(usable_cores() < 2, reason="two ranks need two CPU cores")
VOCAB = 251
PROMPTS = [[5, 9, 33, 250, 100, 4], [249, 250, 7, 126, 125]]
PARAMS = SamplingParams(temperature=0, max_tokens=10, logprobs=3, prompt_logprobs=2)


@pytest.mark.parametrize("family", ["llama-gqa", "mistral-kv-per-rank"])     # untied, tied
def test_padded_vocabulary_gives_tp1_tokens(tmp_path, family):
    path = save_tp_tiny(family, str(tmp_path / family), vocab_size=VOCAB)
    single = tp_llm(path, 1)
    reference = single.generate(PROMPTS, PARAMS)
    single.engine.close()
    llm = tp_llm(path, 2)
    try:
        model = llm.engine.runner.model
        assert model.embed_tokens.shape[0] == 126 and model.lm_head.weight_ref.current.shape[0] == 126
        widths, compute_logits = set(), model.compute_logits

        def logits_seen(hidden):
            logits = compute_logits(hidden)
            widths.add(logits.shape[-1])
            return logits
        model.compute_logits = logits_seen
        got = llm.generate(PROMPTS, PARAMS)
        assert widths == {VOCAB}, widths
        assert_same_or_near_tie(reference, got, f"TP=2 {family}, vocabulary {VOCAB}")
        for ref, out in zip(reference, got):
            for a, b in zip(ref.prompt_logprobs[1:], out.prompt_logprobs[1:]):
                assert a.keys() == b.keys() and all(abs(a[t].logprob - b[t].logprob) < 1e-4 for t in a), (a, b)
            assert all(t < VOCAB for t in out.outputs[0].token_ids)
    finally:
        llm.engine.close()
