"""Speculative decoding gives greedy decoding's tokens and logprobs, on every CPU route: SmolLM2 on prompts whose
answers repeat them (prompt lookup drafts most tokens), with and without ``--batch-invariant``."""
import pytest

from gh200rt.sampling_params import SamplingParams
from tests.engine.route_engines import route_llm

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
PROMPTS = [
    "The quick brown fox jumps over the lazy dog. The quick brown fox jumps over the lazy dog. Again: The quick",
    "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):\n",
    "one two three four five one two three four five one two",
]


def generate(route, prompts, params, **options):
    with route_llm(route, max_model_len=256, num_kv_blocks=64, **options) as llm:
        outs = llm.generate(prompts, params)
        return [(o.outputs[0].token_ids, o.outputs[0].logprobs, o.outputs[0].finish_reason) for o in outs], \
            llm.engine.speculator.stats if llm.engine.speculator else None


def test_batch_invariant_speculation_gives_greedy_decodings_bits(cpu_route):
    """With --batch-invariant a step's rows compute the same bits whatever rows share it: the verified positions are
    exactly the decoded ones, logprobs to the last bit."""
    params = SamplingParams(temperature=0, max_tokens=20, logprobs=2)
    want, _ = generate(cpu_route, PROMPTS, params, batch_invariant=True)
    got, stats = generate(cpu_route, PROMPTS, params, batch_invariant=True, speculative_config=NGRAM)
    assert stats.num_accepted_tokens >= 10, stats          # drafts were verified and kept, not only refused
    assert got == want


def test_speculation_gives_greedy_decodings_tokens(cpu_route):
    """Without it a verifying step's rows take the few-row kernels, a decode's the one-row ones (as a decode batch of
    several rows does): the tokens are greedy decoding's, the logprobs within the route's rounding."""
    params = SamplingParams(temperature=0, max_tokens=20, logprobs=2)
    want, _ = generate(cpu_route, PROMPTS, params)
    got, stats = generate(cpu_route, PROMPTS, params, speculative_config=NGRAM)
    assert stats.num_accepted_tokens >= 10, stats
    tolerance = 1e-4 if cpu_route.cpu_route == "fp32" else 0.1     # half-precision activations round per kernel
    for (w_ids, w_lp, w_reason), (g_ids, g_lp, g_reason) in zip(want, got):
        assert g_ids == w_ids and g_reason == w_reason
        for token, a, b in zip(w_ids, w_lp, g_lp):
            assert b[token].logprob == pytest.approx(a[token].logprob, abs=tolerance)
