"""Tool calling through the official openai client against ``python -m gh200rt.serve`` over the tiny
byte-level Llama (random weights, so every valid call below is the grammar's or the parser's doing):
required and named choices always give calls whose arguments validate, streamed or not; ``auto``
reads Hermes ``<tool_call>`` blocks out of the text; tools reach the chat template."""
import json

import pytest

httpx = pytest.importorskip("httpx")  # the test extra: a bare GPU host need not have it
openai = pytest.importorskip("openai")
jsonschema = pytest.importorskip("jsonschema")

from tests.server.byte_llama import serve_byte_llama  # noqa: E402

WEATHER = {"type": "object", "additionalProperties": False, "required": ["city", "unit"], "properties": {
    "city": {"type": "string", "maxLength": 8}, "unit": {"enum": ["c", "f"]}}}
ADD = {"type": "object", "additionalProperties": False, "required": ["a", "b"], "properties": {
    "a": {"type": "integer", "minimum": 0, "maximum": 99}, "b": {"type": "integer", "minimum": 0, "maximum": 99}}}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "weather", "parameters": WEATHER}},
         {"type": "function", "function": {"name": "add", "parameters": ADD}}]
SCHEMAS = {"get_weather": WEATHER, "add": ADD}
MESSAGES = [{"role": "user", "content": "weather in Paris?"}]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = serve_byte_llama(tmp_path_factory, "byte-alias", "--max-model-len", "1024", "--enable-auto-tool-choice",
                         "--tool-call-parser", "hermes")
    yield s
    s.stop()


def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=120)


def check_calls(calls, only: str | None = None):
    assert calls
    for call in calls:
        assert call.type == "function" and call.id.startswith("chatcmpl-tool-")
        assert only is None or call.function.name == only
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


def streamed_calls(stream):
    """Accumulate streamed tool_call deltas by index, as clients do."""
    calls, finish = {}, None
    for chunk in stream:
        for choice in chunk.choices:
            finish = choice.finish_reason or finish
            for d in choice.delta.tool_calls or []:
                entry = calls.setdefault(d.index, {"id": d.id, "name": "", "arguments": ""})
                entry["name"] += d.function.name or ""
                entry["arguments"] += d.function.arguments or ""
    return [openai.types.chat.ChatCompletionMessageToolCall(
        id=c["id"], type="function", function={"name": c["name"], "arguments": c["arguments"]})
        for _, c in sorted(calls.items())], finish


@pytest.mark.parametrize("stream", [False, True])
def test_required_tool_choice_always_gives_valid_calls(server, stream):
    c = client(server)
    for seed in range(10):
        kw = dict(model="byte", messages=MESSAGES, tools=TOOLS, tool_choice="required", temperature=1.0,
                  seed=seed, max_tokens=400, parallel_tool_calls=False)
        if stream:
            calls, finish = streamed_calls(c.chat.completions.create(stream=True, **kw))
        else:
            out = c.chat.completions.create(**kw)
            calls, finish = out.choices[0].message.tool_calls, out.choices[0].finish_reason
            assert out.choices[0].message.content is None
        assert finish == "tool_calls"
        check_calls(calls)
        assert len(calls) == 1


def test_required_with_parallel_calls_allows_several(server):
    outs = [client(server).chat.completions.create(
        model="byte", messages=MESSAGES, tools=TOOLS, tool_choice="required", temperature=1.0, seed=seed,
        max_tokens=450).choices[0] for seed in range(6)]
    finished = [o for o in outs if o.finish_reason == "tool_calls"]
    for o in finished:
        check_calls(o.message.tool_calls)
    assert finished and max(len(o.message.tool_calls) for o in finished) > 1


@pytest.mark.parametrize("stream", [False, True])
def test_named_tool_choice_gives_arguments_for_that_tool(server, stream):
    c = client(server)
    for seed in range(6):
        kw = dict(model="byte-alias", messages=MESSAGES, tools=TOOLS, temperature=1.0, seed=seed, max_tokens=200,
                  tool_choice={"type": "function", "function": {"name": "add"}})
        if stream:
            calls, _ = streamed_calls(c.chat.completions.create(stream=True, **kw))
        else:
            calls = c.chat.completions.create(**kw).choices[0].message.tool_calls
        check_calls(calls, only="add")


@pytest.mark.parametrize("stream", [False, True])
def test_auto_reads_hermes_tool_calls_out_of_the_text(server, stream):
    """The regex makes the random model write a Hermes call after some content; the parser reads it."""
    regex = r'I will check\.<tool_call>\n\{"name": "get_weather", "arguments": \{"city": "[a-z]{1,6}", "unit": "c"\}\}\n</tool_call>'
    kw = dict(model="byte", messages=MESSAGES, tools=TOOLS, temperature=1.0, seed=1, max_tokens=200,
              extra_body={"guided_regex": regex})
    if stream:
        chunks = list(client(server).chat.completions.create(stream=True, **kw))
        content = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
        calls, finish = streamed_calls(iter(chunks))
    else:
        out = client(server).chat.completions.create(**kw)
        content, calls, finish = out.choices[0].message.content, out.choices[0].message.tool_calls, \
            out.choices[0].finish_reason
    assert content == "I will check."
    assert finish == "tool_calls"
    check_calls(calls, only="get_weather")


def test_auto_without_a_call_is_plain_content_and_none_ignores_tools(server):
    c = client(server)
    out = c.chat.completions.create(model="byte", messages=MESSAGES, tools=TOOLS, temperature=1.0, seed=2,
                                    max_tokens=20, extra_body={"guided_regex": "[a-z ]{5,20}"})
    assert out.choices[0].message.tool_calls is None and out.choices[0].finish_reason in ("stop", "length")
    out = c.chat.completions.create(model="byte", messages=MESSAGES, tools=TOOLS, tool_choice="none", max_tokens=5)
    assert out.choices[0].message.tool_calls is None


def test_tools_and_tool_history_reach_the_chat_template(server):
    with_tools = httpx.post(server.url + "/tokenize", json={"messages": MESSAGES, "tools": TOOLS}).json()
    without = httpx.post(server.url + "/tokenize", json={"messages": MESSAGES}).json()
    assert with_tools["count"] > without["count"] + 50
    history = MESSAGES + [
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
            "name": "get_weather", "arguments": "{\"city\": \"Paris\", \"unit\": \"c\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "21 C"}]
    out = client(server).chat.completions.create(model="byte", messages=history, tools=TOOLS, tool_choice="none",
                                                 max_tokens=3)
    assert out.choices[0].finish_reason in ("stop", "length")
    rendered = httpx.post(server.url + "/tokenize", json={"messages": history}).json()["count"]
    assert rendered > without["count"] + len('{"name": "get_weather"')


@pytest.mark.parametrize("body,param", [
    ({"tools": "x"}, "tools"), ({"tools": [{"type": "function"}]}, "tools"),
    ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": "required", "guided_regex": "a"}, "tool_choice"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "bogus"}}}],
      "tool_choice": "required"}, "tools")])
def test_bad_tool_requests_are_a_400_naming_the_field(server, body, param):
    r = httpx.post(server.url + "/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 3, **body})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_auto_needs_the_server_flags(start_toy_server):
    server = start_toy_server()
    r = httpx.post(server.url + "/v1/chat/completions", json={"messages": MESSAGES, "tools": TOOLS, "max_tokens": 3})
    assert r.status_code == 400 and "--enable-auto-tool-choice" in r.json()["error"]["message"]
