"""Request parsing and validation (no server): every bad field is a 400 naming the field."""
import pytest

from gh200rt.serve.args import ServerConfig, parse_args
from gh200rt.serve.errors import APIError
from gh200rt.serve.metrics import ServerMetrics
from gh200rt.serve.chat_request import parse_chat_request
from gh200rt.serve.protocol import parse_completion_request, parse_prompts
from gh200rt.serve.sse import DONE, sse_event


def test_prompt_shapes():
    assert parse_prompts("hi") == [("hi", None)]
    assert parse_prompts(["a", "b"]) == [("a", None), ("b", None)]
    assert parse_prompts([1, 2]) == [(None, [1, 2])]
    assert parse_prompts([[1], [2, 3]]) == [(None, [1]), (None, [2, 3])]
    for bad in ("", [], [[]], [1, -1], [True], ["a", 1], [""], 5, None, [[1], "a"]):
        with pytest.raises(APIError) as e:
            parse_prompts(bad)
        assert e.value.status == 400 and e.value.param == "prompt"


def test_completion_fields_map_to_sampling_params():
    p = parse_completion_request({"prompt": "x", "max_tokens": 7, "temperature": 0, "top_p": 0.5, "top_k": -1,
                                  "min_p": 0.1, "seed": 2**63 - 1, "stop": "END", "logprobs": 20, "echo": True,
                                  "n": 2, "repetition_penalty": 1.2, "ignore_eos": True, "min_tokens": 3,
                                  "stream": True, "stream_options": {"include_usage": True}, "user": "u"})
    sp = p.params
    assert (sp.max_tokens, sp.temperature, sp.top_p, sp.top_k, sp.stop, sp.logprobs, sp.n) == \
        (7, 0.0, 0.5, 0, ["END"], 20, 2)
    assert p.stream and p.include_usage and p.echo and sp.ignore_eos and sp.min_tokens == 3
    assert parse_completion_request({"prompt": "x", "max_completion_tokens": 5, "max_tokens": 9}).params.max_tokens == 5
    assert parse_completion_request({"prompt": "x"}).params.max_tokens == 16


@pytest.mark.parametrize("field,value", [
    ("logprobs", 21), ("seed", 2**64), ("seed", 2**63), ("seed", -(2**63) - 1), ("temperature", 2.5), ("temperature", "hot"),
    ("max_tokens", 0), ("max_tokens", 1.5), ("n", 0), ("n", 17), ("top_p", 0), ("top_p", 1.1), ("top_k", -2),
    ("min_p", 2), ("presence_penalty", 3), ("frequency_penalty", -3), ("stop", [1]), ("stop", [""]),
    ("stream", "yes"), ("stream_options", "x"), ("echo", 1), ("min_tokens", -1), ("repetition_penalty", 0),
])
def test_out_of_range_fields_are_400(field, value):
    with pytest.raises(APIError) as e:
        parse_completion_request({"prompt": "x", field: value})
    assert e.value.status == 400 and e.value.body()["error"]["type"] == "invalid_request_error"


def test_chat_messages_and_logprobs():
    parsed, messages = parse_chat_request({"messages": [
        {"role": "system", "content": "s"}, {"role": "user", "content": [{"type": "text", "text": "a"},
                                                                      {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": None}], "logprobs": True, "top_logprobs": 5})
    assert messages[1] == {"role": "user", "content": "ab"} and messages[2]["content"] == ""
    assert parsed.logprobs == 5 and parsed.params.max_tokens is None
    for bad in ({"messages": "hi"}, {"messages": [{"role": "robot", "content": "x"}]},
                {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
                {"messages": [{"role": "user", "content": "x"}], "top_logprobs": 3}):
        with pytest.raises(APIError) as e:
            parse_chat_request(bad)
        assert e.value.status == 400


def test_server_flags_generated_and_validated():
    server, engine = parse_args(["--port", "9000", "--api-key", "k", "--max-num-seqs", "4",
                                 "--allowed-origins", "http://a, http://b"])
    assert (server.port, server.api_key, engine.scheduler.max_num_seqs) == (9000, "k", 4)
    assert server.origins == ("http://a", "http://b")
    assert ServerConfig().host == "127.0.0.1" and ServerConfig().port == 8000
    for bad in (["--port", "70000"], ["--max-queued-requests", "-1"], ["--block-size", "3"]):
        with pytest.raises(SystemExit) as e:
            parse_args(bad)
        assert e.value.code == 2


def test_sse_framing_and_metrics_text():
    assert sse_event({"a": 1}) == b'data: {"a":1}\n\n' and DONE == b"data: [DONE]\n\n"
    m = ServerMetrics()
    m.count("requests_received_total", 3)
    m.observe(m.ttft, 0.03)
    text = m.render(num_pending=0)
    assert "gh200rt_requests_received_total 3" in text
    assert 'gh200rt_time_to_first_token_seconds_bucket{le="0.05"} 1' in text
    assert 'gh200rt_time_to_first_token_seconds_bucket{le="0.02"} 0' in text
    assert "gh200rt_kv_blocks_used 0" in text


def test_describe_engine_uses_the_plan_and_survives_without_one():
    from types import SimpleNamespace

    from gh200rt.engine.engine import EngineStats
    from gh200rt.serve.__main__ import describe_engine, describe_platform

    class Plan:
        def explain(self):
            return "layer tier bytes slot"
    assert describe_engine(SimpleNamespace(plan=Plan())) == "layer tier bytes slot"
    stats = EngineStats(0, 0, 10, 0, 0, 0, 0, 0, 0, 0, 0, {"resident": 2, "streamed": 0})
    engine = SimpleNamespace(plan=None, stats=lambda: stats, max_model_len=128,
                             config=SimpleNamespace(cache=SimpleNamespace(block_size=16)))
    text = describe_engine(engine)
    assert "no plan" in text and "2 resident" in text and "10 blocks x 16 tokens = 160 tokens" in text
    broken = SimpleNamespace(plan=SimpleNamespace(explain=lambda: 1 / 0), stats=lambda: stats, max_model_len=128,
                             config=engine.config)
    assert "2 resident" in describe_engine(broken)
    assert "could not describe itself" in describe_engine(SimpleNamespace())
    from gh200rt.platform.detect import detect
    assert describe_platform(detect("cpu")).startswith("cpu (profile cpu)")
    assert "placed by hand" in describe_platform(None)


def test_metrics_render_weight_placement_series():
    from gh200rt.engine.engine import EngineStats
    m = ServerMetrics()
    assert 'gh200rt_weight_layers{tier="streamed"} 0' in m.render(num_pending=0)      # before the model loads
    m.engine_stats = EngineStats(0, 0, 8, 0, 0, 0, 0, 0, 0, 0, 0, {"resident": 20, "streamed": 8}, 4096, 0.25)
    text = m.render(num_pending=0)
    assert 'gh200rt_weight_layers{tier="resident"} 20' in text and 'gh200rt_weight_layers{tier="direct"} 0' in text
    assert "# TYPE gh200rt_weight_bytes_copied_total counter\ngh200rt_weight_bytes_copied_total 4096" in text
    assert "# TYPE gh200rt_copy_wait_seconds_total counter\ngh200rt_copy_wait_seconds_total 0.25" in text
    assert all(line.startswith("# ") or " " in line for line in text.splitlines())


def test_metrics_render_dynamic_tier_series():
    from gh200rt.engine.engine import EngineStats
    m = ServerMetrics()
    assert 'gh200rt_retier_total{direction="demote"} 0' in m.render(num_pending=0)
    m.engine_stats = EngineStats(0, 0, 40, 0, 0, 0, 0, 0, 0, 0, 0, {"resident": 20, "streamed": 8}, 0, 0.0,
                                 arena_weight_blocks=60, retier_counts={"promote": 2, "demote": 5})
    text = m.render(num_pending=0)
    assert "# TYPE gh200rt_retier_total counter" in text
    assert 'gh200rt_retier_total{direction="promote"} 2' in text and 'gh200rt_retier_total{direction="demote"} 5' in text
    assert 'gh200rt_arena_blocks{holder="weights"} 60' in text and 'gh200rt_arena_blocks{holder="kv"} 40' in text


class RecordingTokenizer:
    """Records how the server asks for tokens: a text's ids are its characters' codes."""
    def __init__(self):
        self.calls = []

    def encode(self, text, add_special_tokens=True):
        self.calls.append(("encode", text, add_special_tokens))
        return ([0] if add_special_tokens else []) + [ord(c) for c in text]

    def apply_chat_template(self, messages, add_generation_prompt=True, tokenize=False, **options):
        text = "".join(f"<{m['role']}>{m['content']}" for m in messages)
        self.calls.append(("template", text, tokenize))
        return [ord(c) for c in text] if tokenize else text


def test_add_special_tokens_is_honoured_on_completions_and_chat():
    from gh200rt.serve.generation_routes import tokenized
    from gh200rt.serve.tokenizer_routes import chat_token_ids
    assert parse_completion_request({"prompt": "x"}).add_special_tokens is True
    parsed = parse_completion_request({"prompt": "ab", "add_special_tokens": False})
    tok = RecordingTokenizer()
    assert tokenized(tok, parsed.prompts, None, parsed.add_special_tokens) == [("ab", [97, 98])]
    assert tokenized(tok, parsed.prompts, None, True) == [("ab", [0, 97, 98])]
    chat, messages = parse_chat_request({"messages": [{"role": "user", "content": "hi"}]})
    assert chat.add_special_tokens is False             # the template writes the special tokens it wants
    plain = chat_token_ids(tok, messages, False, add_special_tokens=chat.add_special_tokens)
    chat, _ = parse_chat_request({"messages": [{"role": "user", "content": "hi"}], "add_special_tokens": True})
    assert chat_token_ids(tok, messages, False, add_special_tokens=chat.add_special_tokens) == [0] + plain
    with pytest.raises(APIError) as e:
        parse_completion_request({"prompt": "x", "add_special_tokens": "no"})
    assert e.value.param == "add_special_tokens"


def test_parallel_tool_calls_false_keeps_one_auto_call():
    from gh200rt.serve.tools import ToolRequest, split_tool_calls
    text = ('<tool_call>{"name": "f", "arguments": {"a": 1}}</tool_call>\n'
            '<tool_call>{"name": "g", "arguments": {}}</tool_call>')
    tools = [{"type": "function", "function": {"name": n}} for n in ("f", "g")]
    assert [c.name for c in split_tool_calls(ToolRequest(tools, "auto", parser="hermes"), text)[1]] == ["f", "g"]
    one = split_tool_calls(ToolRequest(tools, "auto", parser="hermes", parallel=False), text)[1]
    assert [c.name for c in one] == ["f"]


@pytest.mark.parametrize("parse", [lambda b: parse_completion_request({"prompt": "x", **b}),
                                   lambda b: parse_chat_request({"messages": [{"role": "user", "content": "x"}], **b})])
def test_user_must_be_a_string(parse):
    parse({"user": "someone"})
    with pytest.raises(APIError) as e:
        parse({"user": 5})
    assert e.value.status == 400 and e.value.param == "user"
