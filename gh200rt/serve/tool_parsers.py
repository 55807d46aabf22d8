"""Tool-call parsers: a model's raw text -> (content, tool calls), per the model family's format,
chosen with ``--tool-call-parser`` as in vLLM.

* ``hermes`` (Hermes, Qwen 2.5/3): ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``,
  any number of them, after optional plain content.
* ``llama3_json`` (Llama 3.1-3.3): the whole answer is ``{"name": ..., "parameters": {...}}``,
  optionally after ``<|python_tag|>``, several separated by ``;``.

``call_start`` says where a tool call may begin, so a stream sends the content before it at once
and holds back only what may be a call.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass


@dataclass
class ParsedToolCall:
    name: str
    arguments: str              # JSON text, as OpenAI sends it


def _call(obj, args_keys: tuple[str, ...]) -> ParsedToolCall | None:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = next((obj[k] for k in args_keys if k in obj), {})
    return ParsedToolCall(obj["name"], args if isinstance(args, str) else json.dumps(args, ensure_ascii=False))


class HermesParser:
    name = "hermes"
    START = "<tool_call>"
    CALL = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.S)

    def call_start(self, text: str) -> int | None:
        index = text.find(self.START)
        if index >= 0:
            return index
        for k in range(len(self.START) - 1, 0, -1):            # the text may end in the start of a tag
            if text.endswith(self.START[:k]):
                return len(text) - k
        return None

    def parse(self, text: str) -> tuple[str | None, list[ParsedToolCall]]:
        start = text.find(self.START)
        if start < 0:
            return text, []
        calls = []
        for body in self.CALL.findall(text[start:]):
            try:
                call = _call(json.loads(body), ("arguments", "parameters"))
            except ValueError:
                call = None
            if call is None:
                return text, []                     # not a well-formed call: the text is the answer
            calls.append(call)
        content = text[:start].strip()
        return content or None, calls


class Llama3JsonParser:
    name = "llama3_json"
    TAG = "<|python_tag|>"

    def call_start(self, text: str) -> int | None:
        stripped = text.lstrip()
        if not stripped or stripped[0] == "{" or self.TAG.startswith(stripped[:len(self.TAG)]):
            return len(text) - len(stripped)
        return None

    def parse(self, text: str) -> tuple[str | None, list[ParsedToolCall]]:
        rest = text.strip()
        if rest.startswith(self.TAG):
            rest = rest[len(self.TAG):].lstrip()
        decoder, calls = json.JSONDecoder(), []
        while rest:
            try:
                obj, end = decoder.raw_decode(rest)
            except ValueError:
                return text, []
            call = _call(obj, ("parameters", "arguments"))
            if call is None:
                return text, []
            calls.append(call)
            rest = rest[end:].lstrip().removeprefix(";").lstrip()
        return (None, calls) if calls else (text, [])


PARSERS = {p.name: p for p in (HermesParser, Llama3JsonParser)}
