"""Tool-call parsers: Hermes/Qwen ``<tool_call>`` blocks and Llama 3.x JSON, what they accept, what they
leave as plain content, and where a stream must start holding text back."""
import json

import pytest

from gh200rt.serve.tool_parsers import HermesParser, Llama3JsonParser


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
