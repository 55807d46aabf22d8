"""Tool-call parsers: Hermes/Qwen ``<tool_call>`` blocks and Llama 3.x JSON, what they accept, what they
leave as plain content, and where a stream must start holding text back."""
import json

import pytest

from gh200rt.serve.tool_parsers import DeepSeekV3Parser, DeepSeekV31Parser, HermesParser, Llama3JsonParser


def args(call):
    return json.loads(call.arguments)


def test_hermes_several_calls_after_content():
    text = ('Let me look.\n<tool_call>\n{"name": "a", "arguments": {"x": 1}}\n</tool_call>\n'
            '<tool_call>{"name": "b", "arguments": {"y": "é"}}</tool_call>')
    content, calls = HermesParser().parse(text)
    assert content == "Let me look." and [c.name for c in calls] == ["a", "b"]
    assert args(calls[0]) == {"x": 1} and args(calls[1]) == {"y": "é"}


@pytest.mark.parametrize("text", ["just text", "<tool_call>{not json}</tool_call>", "<tool_call>[1]</tool_call>"])
def test_hermes_malformed_or_absent_calls_are_content(text):
    assert HermesParser().parse(text) == (text, [])


def test_hermes_unclosed_final_call_is_still_read():
    content, calls = HermesParser().parse('<tool_call>\n{"name": "a", "arguments": {}}')
    assert content is None and calls[0].name == "a" and args(calls[0]) == {}


def test_hermes_call_start_holds_back_a_partial_tag():
    p = HermesParser()
    assert p.call_start("hello") is None
    assert p.call_start("hello <tool") == 6
    assert p.call_start("hi <tool_call>{") == 3


@pytest.mark.parametrize("text,names", [
    ('{"name": "a", "parameters": {"x": 1}}', ["a"]),
    ('<|python_tag|>{"name": "a", "arguments": {"x": 1}}', ["a"]),
    ('{"name": "a", "parameters": {}}; {"name": "b", "parameters": {"z": [1]}}', ["a", "b"])])
def test_llama3_json_calls(text, names):
    content, calls = Llama3JsonParser().parse(text)
    assert content is None and [c.name for c in calls] == names


@pytest.mark.parametrize("text", ["The answer is 4.", '{"not": "a call"}', '{"name": "a", "parameters": {} trailing'])
def test_llama3_json_other_text_is_content(text):
    assert Llama3JsonParser().parse(text) == (text, [])


def test_llama3_call_start():
    p = Llama3JsonParser()
    assert p.call_start("Sure, ") is None
    assert p.call_start("  {") == 2 and p.call_start("<|python") == 0


def deepseek_v3_calls(*calls: tuple[str, str], content: str = "") -> str:
    """Text in DeepSeek-V3's tool-call format (its chat template's)."""
    from gh200rt.serve.tool_parsers import DS_CALL_BEGIN, DS_CALL_END, DS_CALLS_BEGIN, DS_CALLS_END, DS_SEP
    body = "".join(f"{DS_CALL_BEGIN}function{DS_SEP}{name}\n```json\n{args}\n```{DS_CALL_END}" for name, args in calls)
    return content + DS_CALLS_BEGIN + body + DS_CALLS_END


def test_deepseek_v3_calls_after_content():
    text = deepseek_v3_calls(("get_weather", '{"city": "Paris"}'), ("add", '{"a": 1, "b": 2}'), content="Checking. ")
    content, calls = DeepSeekV3Parser().parse(text)
    assert content == "Checking." and [c.name for c in calls] == ["get_weather", "add"]
    assert args(calls[0]) == {"city": "Paris"} and args(calls[1]) == {"a": 1, "b": 2}
    assert DeepSeekV3Parser().call_start(text) == len("Checking. ")
    assert DeepSeekV3Parser().call_start("Checking. <\uff5ctool") == len("Checking. ")   # maybe a call: held back


@pytest.mark.parametrize("text", ["no calls here", deepseek_v3_calls(("f", "{not json}")),
                                  deepseek_v3_calls(("f", "[1, 2]"))])
def test_deepseek_v3_malformed_or_absent_calls_are_content(text):
    assert DeepSeekV3Parser().parse(text) == (text, [])


def test_deepseek_v31_calls():
    from gh200rt.serve.tool_parsers import DS_CALL_BEGIN, DS_CALL_END, DS_CALLS_BEGIN, DS_CALLS_END, DS_SEP
    text = f'{DS_CALLS_BEGIN}{DS_CALL_BEGIN}get_weather{DS_SEP}{{"city": "Oslo"}}{DS_CALL_END}{DS_CALLS_END}'
    content, calls = DeepSeekV31Parser().parse(text)
    assert content is None and calls[0].name == "get_weather" and args(calls[0]) == {"city": "Oslo"}


def test_glm45_calls_with_typed_and_string_arguments():
    from gh200rt.serve.tool_parsers import Glm45Parser
    text = ("Let me check.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n"
            "<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n<arg_key>zip</arg_key>\n<arg_value>75001</arg_value>\n"
            "</tool_call>\n<tool_call>now\n</tool_call>")
    content, calls = Glm45Parser({"get_weather": {"city": "string", "zip": "string", "days": "integer"}}).parse(text)
    assert content == "Let me check." and [c.name for c in calls] == ["get_weather", "now"]
    assert args(calls[0]) == {"city": "Paris", "days": 3, "zip": "75001"}      # zip typed string: kept as text
    assert args(calls[1]) == {}
    assert Glm45Parser().parse("plain") == ("plain", [])
    assert Glm45Parser().call_start("ok <tool_c") == 3


def test_qwen3_coder_calls_read_as_their_schema_types_them():
    from gh200rt.serve.tool_parsers import Qwen3CoderParser
    text = ("Sure.\n<tool_call>\n<function=book>\n<parameter=city>\nNew York\n</parameter>\n<parameter=nights>\n3\n"
            "</parameter>\n<parameter=breakfast>\ntrue\n</parameter>\n<parameter=zip>\n10001\n</parameter>\n"
            "<parameter=extra>\n{\"a\": 1}\n</parameter>\n</function>\n</tool_call>")
    types = {"book": {"city": "string", "nights": "integer", "breakfast": "boolean", "zip": "string"}}
    content, calls = Qwen3CoderParser(types).parse(text)
    assert content == "Sure." and calls[0].name == "book"
    # an untyped parameter stays text, as vLLM's parser leaves it
    assert args(calls[0]) == {"city": "New York", "nights": 3, "breakfast": True, "zip": "10001", "extra": '{"a": 1}'}
    assert Qwen3CoderParser().parse("no call") == ("no call", [])


def test_auto_tool_choice_gives_the_schema_aware_parsers_the_request_tools_types():
    from gh200rt.serve.tools import ToolRequest, split_tool_calls
    tools = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object", "properties": {
        "a": {"type": "integer"}, "label": {"type": "string"}}}}}]
    text = "<tool_call>\n<function=add>\n<parameter=a>\n7\n</parameter>\n<parameter=label>\n42\n</parameter>\n" \
           "</function>\n</tool_call>"
    content, calls = split_tool_calls(ToolRequest(tools, "auto", parser="qwen3_coder"), text)
    assert content is None and args(calls[0]) == {"a": 7, "label": "42"}
    glm = "<tool_call>add<arg_key>a</arg_key><arg_value>7</arg_value><arg_key>label</arg_key><arg_value>42</arg_value>"
    assert args(split_tool_calls(ToolRequest(tools, "auto", parser="glm45"), glm + "</tool_call>")[1][0]) == \
        {"a": 7, "label": "42"}
