"""Anthropic Messages bodies -> the chat request the server runs, and a run's answer -> Anthropic's blocks, without a
server: what each field maps to, what is refused, and that a streamed message adds up to the non-streamed one (a
thinking block, text, then tool_use blocks read by the Hermes parser) whatever the chunking."""
import asyncio
import json

import pytest

from gh200rt.serve.errors import APIError
from gh200rt.serve.generation import ChoiceDelta
from gh200rt.serve.messages_request import parse_messages_request, to_chat_body
from gh200rt.serve.messages_response import message_body
from gh200rt.serve.messages_stream import stream_message

WEATHER = {"name": "get_weather", "description": "weather", "input_schema": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
HELLO = [{"role": "user", "content": "hello"}]


def chat(body: dict, auto: bool = True, reasoning: str | None = "qwen3", count_only: bool = False) -> dict:
    return to_chat_body({"model": "m", "max_tokens": 64, **body}, auto, reasoning, count_only)


def refused(body: dict, match: str, **kw) -> None:
    with pytest.raises(APIError) as e:
        parse_messages_request({"model": "m", "max_tokens": 64, "messages": HELLO, **body}, kw.get("parser", "hermes"),
                               True, 20, kw.get("reasoning", "qwen3"))
    assert e.value.status == 400 and match in e.value.message, e.value.message


def test_a_tool_round_trip_becomes_tool_calls_and_tool_messages():
    history = [
        {"role": "user", "content": "weather in Paris?"},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "need the tool", "signature": ""},
            {"type": "text", "text": "Checking."},
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "21 C"}]},
            {"type": "tool_result", "tool_use_id": "toolu_2", "content": "timeout", "is_error": True},
            {"type": "text", "text": "and tomorrow?"}]}]
    body = chat({"system": "be brief", "messages": history, "tools": [WEATHER]})
    assert body["messages"] == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "weather in Paris?"},
        {"role": "assistant", "content": "Checking.", "reasoning_content": "need the tool", "tool_calls": [
            {"id": "toolu_1", "type": "function",
             "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "21 C", "name": "get_weather"},
        {"role": "tool", "tool_call_id": "toolu_2", "content": "Error: timeout"},
        {"role": "user", "content": "and tomorrow?"}]
    assert body["tools"] == [{"type": "function", "function": {
        "name": "get_weather", "description": "weather", "parameters": WEATHER["input_schema"]}}]
    assert body["tool_choice"] == "auto" and body["parallel_tool_calls"] is True


@pytest.mark.parametrize("choice,want", [
    ({"type": "any"}, ("required", True)), ({"type": "none"}, ("none", True)),
    ({"type": "auto", "disable_parallel_tool_use": True}, ("auto", False)),
    ({"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True},
     ({"type": "function", "function": {"name": "get_weather"}}, False))])
def test_tool_choice_maps_onto_the_chat_choices(choice, want):
    body = chat({"messages": HELLO, "tools": [WEATHER], "tool_choice": choice})
    assert (body["tool_choice"], body["parallel_tool_calls"]) == want


def test_thinking_a_prefill_and_a_format_map_onto_the_template_and_constraints():
    assert chat({"messages": HELLO, "thinking": {"type": "disabled"}})["chat_template_kwargs"] == {
        "enable_thinking": False, "thinking": False}
    assert chat({"messages": HELLO, "thinking": {"type": "adaptive"}})["chat_template_kwargs"]["enable_thinking"]
    assert chat({"messages": HELLO, "thinking": {"type": "enabled", "budget_tokens": 2048}, "max_tokens": 2048})
    prefill = chat({"messages": HELLO + [{"role": "assistant", "content": "Sure"}]})
    assert prefill["continue_final_message"] is True and prefill["add_generation_prompt"] is False
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    fmt = chat({"messages": HELLO, "output_config": {"format": {"type": "json_schema", "schema": schema}}})
    assert fmt["response_format"] == {"type": "json_schema", "json_schema": {"name": "output", "schema": schema}}
    counted = chat({"messages": HELLO, "tools": [WEATHER]}, auto=False, count_only=True)
    assert counted["tool_choice"] == "none" and "max_tokens" not in counted


@pytest.mark.parametrize("body,match", [
    ({"thinking": {"type": "enabled", "budget_tokens": 1024}, "max_tokens": 2048}, "cannot end the thinking"),
    ({"thinking": {"type": "enabled", "budget_tokens": 100}}, "'thinking.budget_tokens'"),
    ({"thinking": {"type": "adaptive", "display": "omitted"}}, "'thinking.display'"),
    ({"thinking": {"type": "adaptive"}, "tools": [WEATHER], "tool_choice": {"type": "any"}}, "constrained"),
    ({"tools": [{**WEATHER, "strict": True}]}, "'strict': true"),
    ({"tools": [{**WEATHER, "input_examples": [{"city": "x"}]}]}, "input examples"),
    ({"tools": [WEATHER, WEATHER]}, "more than once"),
    ({"tools": [{"name": "f", "input_schema": {"type": "array"}}]}, "'tools[0].input_schema'"),
    ({"tools": [WEATHER], "tool_choice": {"type": "tool", "name": "nope"}}, "'tool_choice.name'"),
    ({"tools": [WEATHER], "tool_choice": {"type": "any", "x": 1}}, "unknown key 'x'"),
    ({"output_config": {"effort": "high"}}, "'output_config.effort'"),
    ({"metadata": {"user_id": "u", "tag": "x"}}, "'metadata'"),
    ({"mcp_servers": [{"url": "x"}]}, "MCP"),
    ({"context_management": {}}, "context_management"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "x", "cache_control": {"type": "x"}}]}]},
     "'messages[0].content[0].cache_control'"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "x", "bogus": 1}]}]}, "unknown key 'bogus'"),
    ({"messages": [{"role": "user", "content": "x", "name": "bob"}]}, "unknown key 'name'"),
    ({"messages": [{"role": "assistant", "content": [{"type": "redacted_thinking", "data": "x"}]}]}, "redacted"),
    ({"messages": HELLO + [{"role": "assistant", "content": [
        {"type": "tool_use", "id": "t", "name": "get_weather", "input": {}}]}], "tools": [WEATHER]}, "prefill"),
    ({"temperature": 2.5}, "'temperature'"),
    ({"stop_sequences": [""]}, "'stop_sequences'"),
])
def test_what_cannot_be_honoured_is_refused_naming_the_field(body, match):
    refused(body, match)


def test_thinking_needs_a_reasoning_parser_and_chat_errors_name_anthropic_fields():
    refused({"thinking": {"type": "adaptive"}}, "--reasoning-parser", reasoning=None)
    refused({"tools": [{"name": "f", "input_schema": {"type": "object", "properties": {"a": {"type": "bogus"}}}}],
             "tool_choice": {"type": "any"}}, "'input_schema'")


class FakeRun:
    """A finished answer, delivered in ``pieces``, as GenerationRun yields it."""

    def __init__(self, parsed, pieces: list[str], finish: str = "stop", stop=None):
        self.parsed, self.pieces, self.finish, self.stop = parsed, pieces, finish, stop
        parsed.prompts = [(None, list(range(10)))]
        self.prompt_tokens, self.num_cached_tokens, self.completion_tokens = 10, 4, len(pieces)
        self.closed = False

    async def deltas(self):
        for i, piece in enumerate(self.pieces):
            last = i == len(self.pieces) - 1
            if piece is None:
                raise APIError(503, "the engine stopped")
            yield [ChoiceDelta(0, piece, [i], None, self.finish if last else None, self.stop if last else None)]

    def close(self):
        self.closed = True

    def body(self) -> dict:
        return message_body(self, "msg_1", "m", [d for batch in self._collect() for d in batch])

    def _collect(self):
        async def go():
            return [batch async for batch in self.deltas()]
        return asyncio.run(go())


def streamed(run) -> tuple[list[dict], dict]:
    """(the events, the message they add up to), as a client accumulates them."""
    async def go():
        return [chunk async for chunk in stream_message(run, "msg_1", "m")]
    events = []
    for frame in b"".join(asyncio.run(go())).decode().strip().split("\n\n"):
        name, data = frame.split("\n")
        events.append(json.loads(data.removeprefix("data: ")))
        assert events[-1]["type"] == name.removeprefix("event: ")
    message = json.loads(json.dumps(events[0]["message"]))
    for e in events[1:]:
        if e["type"] == "content_block_start":
            assert e["index"] == len(message["content"])
            message["content"].append(dict(e["content_block"]))
        elif e["type"] == "content_block_delta":
            block, delta = message["content"][e["index"]], e["delta"]
            key = {"text_delta": "text", "thinking_delta": "thinking", "input_json_delta": "partial_json",
                   "signature_delta": "signature"}[delta["type"]]
            if key == "signature":
                block["signature"] = delta["signature"]
            elif key == "partial_json":
                block["input"] = json.loads(delta["partial_json"])
            else:
                block[key] += delta[key]
        elif e["type"] == "message_delta":
            message.update(e["delta"])
            message["usage"].update(e["usage"])
    return events, message


def parsed_request(body: dict):
    return parse_messages_request({"model": "m", "max_tokens": 64, "messages": HELLO, **body}, "hermes", True, 20,
                                  "qwen3")[0]


CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
ANSWER = "<think>look it up</think>I will check." + CALL


@pytest.mark.parametrize("size", [1, 3, 1000])
def test_a_stream_adds_up_to_the_message_thinking_text_and_tool_use(size):
    pieces = [ANSWER[i:i + size] for i in range(0, len(ANSWER), size)]
    body = FakeRun(parsed_request({"tools": [WEATHER]}), pieces).body()
    assert [b["type"] for b in body["content"]] == ["thinking", "text", "tool_use"]
    assert body["content"][0] == {"type": "thinking", "thinking": "look it up", "signature": ""}
    assert body["content"][1] == {"type": "text", "text": "I will check."}
    assert body["content"][2]["input"] == {"city": "Paris"} and body["content"][2]["id"].startswith("toolu_")
    assert body["stop_reason"] == "tool_use" and body["stop_sequence"] is None
    assert body["usage"] == {"input_tokens": 6, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 4,
                             "output_tokens": len(pieces)}
    run = FakeRun(parsed_request({"tools": [WEATHER]}), pieces)
    events, message = streamed(run)
    assert run.closed
    assert [e["type"] for e in events[:2]] == ["message_start", "ping"] and events[-1]["type"] == "message_stop"
    assert events[0]["message"]["usage"]["input_tokens"] == 10          # before the cache hits are known
    for got, want in zip(message["content"], body["content"]):
        assert {**got, "id": None} == {**want, "id": None}
    assert len(message["content"]) == 3
    assert (message["stop_reason"], message["usage"]) == (body["stop_reason"], body["usage"])


def test_stop_reasons_and_arguments_that_are_not_an_object():
    assert FakeRun(parsed_request({}), ["ab", "c"], "stop", "END").body()["stop_reason"] == "stop_sequence"
    assert FakeRun(parsed_request({}), ["ab", "c"], "stop", 7).body()["stop_reason"] == "end_turn"
    assert FakeRun(parsed_request({"max_tokens": 2}), ["ab", "c"], "length").body()["stop_reason"] == "max_tokens"
    cut = FakeRun(parsed_request({"max_tokens": 9}), ["ab", "c"], "length").body()
    assert cut["stop_reason"] == "model_context_window_exceeded"
    odd = '<tool_call>\n{"name": "get_weather", "arguments": "Paris"}\n</tool_call>'
    for run in (FakeRun(parsed_request({"tools": [WEATHER]}), [odd]), ):
        body = run.body()
        assert body["content"] == [{"type": "text", "text": odd}] and body["stop_reason"] == "end_turn"
        assert streamed(FakeRun(parsed_request({"tools": [WEATHER]}), [odd]))[1]["content"] == body["content"]


def test_an_error_mid_stream_is_an_error_event():
    run = FakeRun(parsed_request({}), ["ab", None])
    events, _ = streamed(run)
    assert events[-1] == {"type": "error", "error": {"type": "overloaded_error", "message": "the engine stopped"}}
    assert run.closed
