"""Structured output after a reasoning block (structured/reasoning_gate.py), in the engine on the tiny byte-level
Llama: the block is free text, the answer after its end tokens follows the grammar; a model that may open the block
itself gets the opening token beside the grammar's first mask; speculative decoding drafts nothing before the answer
and the grammar still holds. The block's tags here are bytes of this tokenizer, pushed by logit_bias so the random
model writes them."""
import json

import pytest
import torch

jsonschema = pytest.importorskip("jsonschema")  # the test extra: a bare GPU host need not have it

from gh200rt.engine.logits_processors import apply_grammar_masks  # noqa: E402
from gh200rt.sampling_params import SamplingParams  # noqa: E402
from gh200rt.serve.reasoning import PARSERS, reasoning_gate  # noqa: E402
from gh200rt.structured import Constraint  # noqa: E402
from gh200rt.structured.reasoning_gate import GatedGrammar, ReasoningGate  # noqa: E402
from tests.engine.real_models import SharedModel  # noqa: E402
from tests.engine.test_structured_engine import SCHEMA  # noqa: E402
from tests.server.byte_llama import save_byte_llama  # noqa: E402


@pytest.fixture(scope="module")
def byte_model(tmp_path_factory):
    return SharedModel(save_byte_llama(str(tmp_path_factory.mktemp("byte-llama-gate"))))


def token(model, text: str) -> int:
    ids = model.tokenizer.encode(text, add_special_tokens=False)
    assert len(ids) == 1, ids
    return ids[0]


def answer_after(text: str, end: str) -> str:
    assert end in text, text
    return text[text.index(end) + len(end):]


@pytest.mark.parametrize("speculative", [False, True])
def test_the_grammar_holds_after_the_block_and_the_block_is_free(byte_model, speculative):
    """The prompt opened the block (DeepSeek-R1's way): '@' and '#' pushed up, the block ends at "@#"; before it only
    those two are likely, after it the answer is the schema's JSON (the grammar masks both)."""
    at, hash_ = token(byte_model, "@"), token(byte_model, "#")
    options = dict(speculative_config={"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1,
                                       "prompt_lookup_max": 2}) if speculative else {}
    llm = byte_model.llm(max_model_len=256, **options)
    params = SamplingParams(temperature=1.0, seed=3, max_tokens=160, n=2, logit_bias={at: 30.0, hash_: 30.0},
                            structured_output=Constraint.json_schema(SCHEMA),
                            reasoning_gate=ReasoningGate((at, hash_)))
    out = llm.generate([[1, 5, 6, 7, 64, 35]], params)[0]
    for choice in out.outputs:
        block = choice.text[:choice.text.index("@#")]
        assert set(block) <= {"@", "#"}, block
        assert choice.finish_reason == "stop", choice.text
        jsonschema.validate(json.loads(answer_after(choice.text, "@#")), SCHEMA)


def test_a_model_that_opens_the_block_itself_may_or_may_not(byte_model):
    """Qwen3's way: the first token is the opening one ('<', pushed up) or the answer's own; either way the answer
    is the schema's JSON, after '>' when the block was opened."""
    llm = byte_model.llm(max_model_len=256)
    lt, gt = token(byte_model, "<"), token(byte_model, ">")
    gate = ReasoningGate((gt,), lt)
    schema = Constraint.json_schema(SCHEMA)
    opened = llm.generate([[1, 5, 6]], SamplingParams(temperature=1.0, seed=4, max_tokens=160, structured_output=schema,
                                                      reasoning_gate=gate, logit_bias={lt: 30.0, gt: 30.0}))[0]
    text = opened.outputs[0].text
    assert text.startswith("<") and set(text[:text.index(">")]) <= {"<"}, text
    jsonschema.validate(json.loads(answer_after(text, ">")), SCHEMA)
    for seed in range(3):       # the opening token pushed down: the answer from the first token, under the grammar
        out = llm.generate([[1, 5, 6]], SamplingParams(temperature=1.0, seed=seed, max_tokens=160,
                                                       structured_output=schema, reasoning_gate=gate,
                                                       logit_bias={lt: -30.0}))[0].outputs[0]
        assert out.finish_reason == "stop", out.text
        jsonschema.validate(json.loads(out.text), SCHEMA)


def test_the_mask_follows_the_gates_state(byte_model):
    """No mask inside the block; the grammar's mask plus the opening token before the first token; the grammar's
    alone in the answer, which the tags never reach."""
    from gh200rt.structured.matchers import GrammarMatchers
    tok = byte_model.tokenizer
    matchers = GrammarMatchers(tok, byte_model.llm(max_model_len=64).engine.vocab_size, {2})
    lt, gt, brace, letter = (token(byte_model, c) for c in "<>{q")
    gate = GatedGrammar(matchers.new(Constraint.json_schema({"type": "object"})), ReasoningGate((gt,), lt))
    vocab = matchers.vocab_size

    def allowed() -> set[int]:
        logits = torch.zeros(1, vocab)
        if gate.masking:
            apply_grammar_masks(logits, [(0, gate)])
        return {t for t in (lt, gt, brace, letter) if logits[0, t] == 0}
    assert allowed() == {lt, brace} and gate.gating
    gate.accept(lt)
    assert allowed() == {lt, gt, brace, letter} and not gate.masking
    gate.accept(letter)
    gate.accept(gt)
    assert allowed() == {brace} and not gate.gating
    gate.accept(brace)
    assert not gate.failed


def test_the_server_gates_only_where_the_tags_are_tokens(byte_model):
    """reasoning_gate reads the tags through the tokenizer: one opening token is needed where the model opens the
    block itself (the byte tokenizer spells '<think>' in several: no gate, the answer has no block); the end may be a
    sequence."""
    tok = byte_model.tokenizer
    assert reasoning_gate(tok, PARSERS["qwen3"]) is None
    gate = reasoning_gate(tok, PARSERS["deepseek_r1"])
    assert gate is not None and gate.start_id is None
    assert tok.decode(list(gate.end_ids)) == "</think>"


def test_a_constrained_chat_request_keeps_its_block_where_the_tags_are_tokens(byte_model):
    """The chat route's decision (generation_routes.gate_grammar_after_reasoning): DeepSeek-R1's parser gates the
    grammar after the end tag's tokens and keeps splitting the reasoning off; Qwen3's needs a one-token '<think>',
    which this tokenizer lacks: the answer then has no block and the grammar holds from the first token."""
    from gh200rt.serve.chat_request import parse_chat_request
    from gh200rt.serve.generation_routes import gate_grammar_after_reasoning
    body = {"messages": [{"role": "user", "content": "hi"}], "response_format": {"type": "json_object"}}
    for parser, gated in (("deepseek_r1", True), ("qwen3", False)):
        parsed, _ = parse_chat_request(dict(body), reasoning_parser=parser)
        assert parsed.extra["reasoning"] is not None and parsed.params.structured_output is not None
        gate_grammar_after_reasoning(parsed, byte_model.tokenizer)
        assert (parsed.params.reasoning_gate is not None, parsed.extra["reasoning"] is not None) == (gated, gated)
    plain, _ = parse_chat_request({"messages": body["messages"]}, reasoning_parser="deepseek_r1")
    gate_grammar_after_reasoning(plain, byte_model.tokenizer)
    assert plain.params.reasoning_gate is None and plain.extra["reasoning"] is not None
