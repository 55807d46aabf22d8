"""Grammar-constrained generation in the engine itself (tiny random byte-level Llama): the grammar
state follows the output tokens through batching and preemption by recompute, and logit_bias and
grammar masks are applied per row of a mixed batch."""
import json

import pytest
import torch

jsonschema = pytest.importorskip("jsonschema")  # the test extra: a bare GPU host need not have it

from gh200rt.engine.logits_processors import apply_logit_bias, unpack_bitmask  # noqa: E402
from gh200rt.sampling_params import SamplingParams  # noqa: E402
from gh200rt.structured import Constraint  # noqa: E402
from tests.engine.real_models import SharedModel  # noqa: E402
from tests.server.byte_llama import save_byte_llama  # noqa: E402

SCHEMA = {"type": "object", "additionalProperties": False, "required": ["k", "v"], "properties": {
    "k": {"enum": ["alpha", "beta"]}, "v": {"type": "array", "maxItems": 4,
                                          "items": {"type": "integer", "minimum": 0, "maximum": 999}}}}


@pytest.fixture(scope="module")
def byte_model(tmp_path_factory):
    return SharedModel(save_byte_llama(str(tmp_path_factory.mktemp("byte-llama"))))


def test_grammar_survives_preemption_by_recompute(byte_model):
    llm = byte_model.llm(num_kv_blocks=32, block_size=4, max_model_len=128, max_num_seqs=8)
    constrained = SamplingParams(temperature=1.0, seed=11, max_tokens=100, n=2,
                                 structured_output=Constraint.json_schema(SCHEMA))
    free = SamplingParams(temperature=1.0, seed=12, max_tokens=30, ignore_eos=True)
    outputs = llm.generate([[1, 5, 6, 7], [1, 8, 9], [1, 10, 11, 12, 13], [1, 14]],
                           [constrained, free, constrained, free])
    assert llm.engine.stats().num_preemptions > 0
    for out in (outputs[0], outputs[2]):
        for choice in out.outputs:
            assert choice.finish_reason == "stop", choice.text
            jsonschema.validate(json.loads(choice.text), SCHEMA)
    assert outputs[1].outputs[0].finish_reason == "length"


def test_logit_bias_pushes_the_chosen_token(byte_model):
    llm = byte_model.llm(max_model_len=64)
    target = byte_model.tokenizer.encode("Z", add_special_tokens=False)[0]
    out = llm.generate([[1, 5, 6]], SamplingParams(temperature=1.0, seed=1, max_tokens=6, ignore_eos=True,
                                                   logit_bias={target: 100.0}))[0]
    assert out.token_ids == [target] * 6


def test_logit_bias_and_bitmask_are_batched_tensor_ops():
    logits = torch.zeros(3, 40)
    apply_logit_bias(logits, [(0, {1: 2.0, 39: -1.0}), (2, {1: 5.0})])
    assert logits[0, 1] == 2.0 and logits[0, 39] == -1.0 and logits[2, 1] == 5.0 and logits[1].abs().sum() == 0
    words = torch.tensor([[0b101, -2**31], [-1, 0]], dtype=torch.int32)      # -2**31: only bit 31
    allowed = unpack_bitmask(words, 40)
    assert allowed[0].nonzero().flatten().tolist() == [0, 2]           # bit 31 of word 1 (token 63) is past V
    assert allowed[1, :32].all() and not allowed[1, 32:].any()
