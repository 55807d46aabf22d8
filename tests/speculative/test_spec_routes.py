"""Speculative decoding gives greedy decoding's tokens on every CPU route (SmolLM2's first four blocks, which have
every linear shape of the model; prompts whose answers repeat them: prompt lookup drafts most tokens), and with
``--batch-invariant`` its bits, logprobs included. One engine per mode generates with its speculator and without it
(set aside for the run)."""
import pytest
import torch

from gh200rt.sampling_params import SamplingParams
from tests.engine.route_engines import route_llm

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
PROMPTS = [
    "The quick brown fox jumps over the lazy dog. The quick brown fox jumps over the lazy dog. Again: The quick",
    "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):\n",
]


def with_and_without(llm, params):
    """(outputs without speculation, outputs with it, the drafts' stats) of one engine."""
    engine = llm.engine
    speculator, engine.speculator = engine.speculator, None
    try:
        want = llm.generate(PROMPTS, params)
    finally:
        engine.speculator = speculator
    return want, llm.generate(PROMPTS, params), speculator.stats


def test_speculation_gives_greedy_decodings_tokens_and_its_bits_when_batch_invariant(cpu_route, short_smollm2):
    params = SamplingParams(temperature=0, max_tokens=16, logprobs=2)
    with route_llm(cpu_route, short_smollm2, enable_prefix_caching=False, speculative_config=NGRAM) as llm:
        want, got, stats = with_and_without(llm, params)
    assert stats.num_accepted_tokens >= 4, stats            # drafts were verified and kept, not only refused
    # a verifying step's k + 1 rows take the few-row kernels where a lone decode takes the one-row ones (as a decode
    # batch of several rows does): the tokens are greedy decoding's, the logprobs within the route's rounding
    tolerance = 1e-4 if cpu_route.cpu_route == "fp32" else 0.1     # half-precision activations round per kernel
    for w, g in zip(want, got):
        a, b = w.outputs[0], g.outputs[0]
        assert (b.token_ids, b.finish_reason) == (a.token_ids, a.finish_reason)
        for token, x, y in zip(a.token_ids, a.logprobs, b.logprobs):
            assert y[token].logprob == pytest.approx(x[token].logprob, abs=tolerance)
    with route_llm(cpu_route, short_smollm2, enable_prefix_caching=False, batch_invariant=True,
                   speculative_config=NGRAM) as llm:
        want, got, stats = with_and_without(llm, params)
    assert stats.num_accepted_tokens >= 4, stats
    assert [(o.outputs[0].token_ids, o.outputs[0].logprobs) for o in got] == \
        [(o.outputs[0].token_ids, o.outputs[0].logprobs) for o in want]


@pytest.fixture(scope="module")
def smollm2_head(tmp_path_factory):
    """A random EAGLE-3 head for SmolLM2's first four blocks (the short_smollm2 fixture: its blocks 0, 2 and 3; a
    4,096-token draft vocabulary, kept small)."""
    from gh200rt.bench.random_heads import write_random_eagle3_head
    return write_random_eagle3_head(str(tmp_path_factory.mktemp("smollm2-eagle3")), hidden=576, heads=9, kv_heads=3,
                                    intermediate=1536, vocab=49152, draft_vocab=4096,
                                    aux_ids=[0, 2, 3])


def test_an_eagle3_head_in_the_routes_resident_form_keeps_the_bits(cpu_route, smollm2_head, short_smollm2):
    """The head's linears take the route's resident form (AMX tiles, reordered fp32, fp16...) and draft on it; the
    target's batch-invariant bits are unchanged."""
    params = SamplingParams(temperature=0, max_tokens=8, logprobs=2)
    config = {"method": "eagle3", "model": smollm2_head, "num_speculative_tokens": 2}
    with route_llm(cpu_route, short_smollm2, enable_prefix_caching=False, batch_invariant=True,
                   speculative_config=config) as llm:
        want, got, stats = with_and_without(llm, params)
        head, target = llm.engine.speculator.draft.head, llm.engine.runner.model
        converted = [not isinstance(m.lm_head.weight_ref.current, torch.Tensor) for m in (target, head)]
    assert stats.num_draft_tokens > 0, stats
    assert [(o.outputs[0].token_ids, o.outputs[0].logprobs) for o in got] == \
        [(o.outputs[0].token_ids, o.outputs[0].logprobs) for o in want]
    assert converted[1] == converted[0], f"{cpu_route.name}: the target's head converted {converted[0]}, the draft's " \
                                         f"{converted[1]}"


def test_a_gguf_draft_takes_the_targets_forms(cpu_route, short_smollm2):
    """A draft read from a GGUF file takes the forms the route gives the target from it: where the target keeps the
    file's blocks for single rows (a GGUF model's default route), so does the draft, which decodes one row a
    sequence (it read the fp16 form: twice the bytes a drafted token); drafts are verified and kept."""
    from gh200rt.backends.cpu.prepack import linear_formats
    draft = {"method": "draft_model", "model": short_smollm2, "num_speculative_tokens": 3}
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    with route_llm(cpu_route, short_smollm2, enable_prefix_caching=False, speculative_config=draft) as llm:
        forms = linear_formats(llm.engine.speculator.draft.draft.model)
        assert forms == linear_formats(llm.engine.runner.model), forms
        want, got, stats = with_and_without(llm, params)
    assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in want]
    assert stats.num_accepted_tokens > 0, stats
