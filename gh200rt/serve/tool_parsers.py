"""Tool-call parsers: a model's raw text -> (content, tool calls), per the model family's format,
chosen with ``--tool-call-parser`` as in vLLM.

* ``hermes`` (Hermes, Qwen 2.5/3): ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``,
  any number of them, after optional plain content.
* ``llama3_json`` (Llama 3.1-3.3): the whole answer is ``{"name": ..., "parameters": {...}}``,
  optionally after ``<|python_tag|>``, several separated by ``;``.
* ``glm45`` (GLM-4.5 / 4.6): ``<tool_call>NAME<arg_key>k</arg_key><arg_value>v</arg_value>...</tool_call>``.
* ``qwen3_coder`` (Qwen3-Coder): ``<tool_call><function=NAME><parameter=k>v</parameter>...</function></tool_call>``.
* ``deepseek_v3`` (DeepSeek-V3 / R1, Kimi-K2's template too) and ``deepseek_v31`` (V3.1 / V3.2): calls between
  DeepSeek's ``<｜tool▁calls▁begin｜>`` / ``<｜tool▁calls▁end｜>`` tokens, each a name and JSON arguments.

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


class TaggedCallParser:
    """A format whose calls follow the answer's content from a ``START`` tag, each one a match of ``CALL``;
    ``call_of(match)`` reads one (None: not a well-formed call, and then the whole text is the answer).
    ``param_types``: per tool, its arguments' JSON-schema types, for formats that write values bare."""
    START: str
    CALL: re.Pattern

    def __init__(self, param_types: dict[str, dict[str, str]] | None = None):
        self.param_types = param_types or {}

    def call_start(self, text: str) -> int | None:
        return _tag_start(text, self.START)

    def parse(self, text: str) -> tuple[str | None, list[ParsedToolCall]]:
        start = text.find(self.START)
        if start < 0:
            return text, []
        calls = [self.call_of(match) for match in self.CALL.finditer(text[start:])]
        if not calls or None in calls:
            return text, []
        return text[:start].strip() or None, calls

    def call_of(self, match: re.Match) -> ParsedToolCall | None:
        raise NotImplementedError


class HermesParser(TaggedCallParser):
    name = "hermes"
    START = "<tool_call>"
    CALL = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.S)

    def call_of(self, match: re.Match) -> ParsedToolCall | None:
        try:
            return _call(json.loads(match.group(1)), ("arguments", "parameters"))
        except ValueError:
            return None


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


# DeepSeek's special tokens: a fullwidth bar (U+FF5C) and the SentencePiece space (U+2581) in each
_BAR, _SP = "\uff5c", "\u2581"
DS_CALLS_BEGIN = f"<{_BAR}tool{_SP}calls{_SP}begin{_BAR}>"
DS_CALLS_END = f"<{_BAR}tool{_SP}calls{_SP}end{_BAR}>"
DS_CALL_BEGIN = f"<{_BAR}tool{_SP}call{_SP}begin{_BAR}>"
DS_CALL_END = f"<{_BAR}tool{_SP}call{_SP}end{_BAR}>"
DS_SEP = f"<{_BAR}tool{_SP}sep{_BAR}>"


class DeepSeekV3Parser(TaggedCallParser):
    """DeepSeek-V3 / R1 (and V3-0324): after optional content, ``<｜tool▁calls▁begin｜>`` then per call
    ``<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME`` and its arguments as a fenced ```json block,
    ``<｜tool▁call▁end｜>``; ``<｜tool▁calls▁end｜>`` last."""
    name = "deepseek_v3"
    START = DS_CALLS_BEGIN
    CALL = re.compile(re.escape(DS_CALL_BEGIN) + r"(?P<type>[^\n]*?)" + re.escape(DS_SEP)
                      + r"(?P<name>[^\n]*)\n```(?:json)?\n(?P<args>.*?)\n```\s*(?:" + re.escape(DS_CALL_END) + "|$)",
                      re.S)

    def call_of(self, match: re.Match) -> ParsedToolCall | None:
        return _json_call(match.group("name").strip(), match.group("args"))


class DeepSeekV31Parser(DeepSeekV3Parser):
    """DeepSeek-V3.1 / V3.2: ``<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{arguments}<｜tool▁call▁end｜>``."""
    name = "deepseek_v31"
    CALL = re.compile(re.escape(DS_CALL_BEGIN) + r"(?P<name>.*?)" + re.escape(DS_SEP) + r"(?P<args>.*?)\s*(?:"
                      + re.escape(DS_CALL_END) + "|$)", re.S)


class Glm45Parser(TaggedCallParser):
    """GLM-4.5 / 4.6: after optional content, per call ``<tool_call>NAME`` then ``<arg_key>K</arg_key>``
    ``<arg_value>V</arg_value>`` pairs and ``</tool_call>``. A value is JSON where it parses as JSON and the tool's
    schema does not say string (GLM writes strings bare), else the text as it stands."""
    name = "glm45"
    START = "<tool_call>"
    CALL = re.compile(r"<tool_call>\s*(?P<name>[^\n<]+?)\s*(?=<arg_key>|</tool_call>|$)(?P<args>.*?)(?:</tool_call>|$)",
                      re.S)
    ARG = re.compile(r"<arg_key>(?P<key>.*?)</arg_key>\s*<arg_value>(?P<value>.*?)</arg_value>", re.S)

    def call_of(self, match: re.Match) -> ParsedToolCall:
        name = match.group("name").strip()
        types = self.param_types.get(name, {})
        args = {arg.group("key").strip(): arg.group("value") for arg in self.ARG.finditer(match.group("args"))}
        return _typed_call(name, {key: value if types.get(key) == "string" else _json_or_text(value)
                                  for key, value in args.items()})


class Qwen3CoderParser(TaggedCallParser):
    """Qwen3-Coder: ``<tool_call><function=NAME><parameter=KEY>VALUE</parameter>...</function></tool_call>``, each
    on its own lines. A value is read as its tool's schema types it (numbers, booleans, objects and arrays as JSON);
    a string, an untyped or an unknown parameter stays text (as vLLM's parser does), less the newlines around it."""
    name = "qwen3_coder"
    START = "<tool_call>"
    CALL = re.compile(r"<tool_call>\s*<function=(?P<name>[^>\n]+)>(?P<params>.*?)(?:</function>|$)", re.S)
    PARAM = re.compile(r"<parameter=(?P<key>[^>\n]+)>(?P<value>.*?)(?:</parameter>|(?=<parameter=)|$)", re.S)

    def call_of(self, match: re.Match) -> ParsedToolCall:
        name = match.group("name").strip()
        types = self.param_types.get(name, {})
        args = {param.group("key").strip(): param.group("value").strip("\n")
                for param in self.PARAM.finditer(match.group("params"))}
        return _typed_call(name, {key: _json_or_text(value) if types.get(key) not in (None, "string") else value
                                  for key, value in args.items()})


def _typed_call(name: str, args: dict) -> ParsedToolCall:
    return ParsedToolCall(name, json.dumps(args, ensure_ascii=False))


def _json_or_text(value: str):
    try:
        return json.loads(value)
    except ValueError:
        return value


def _tag_start(text: str, tag: str) -> int | None:
    """Where ``tag`` starts in ``text``, or where the text ends in a prefix of it (a stream holds that back)."""
    index = text.find(tag)
    if index >= 0:
        return index
    for k in range(len(tag) - 1, 0, -1):
        if text.endswith(tag[:k]):
            return len(text) - k
    return None


def _json_call(name: str, args: str) -> ParsedToolCall | None:
    """A call whose arguments are a JSON object (re-serialised as OpenAI sends them), or None."""
    try:
        parsed = json.loads(args)
    except ValueError:
        return None
    if not name or not isinstance(parsed, dict):
        return None
    return ParsedToolCall(name, json.dumps(parsed, ensure_ascii=False))


PARSERS = {p.name: p for p in (HermesParser, Llama3JsonParser, DeepSeekV3Parser, DeepSeekV31Parser, Glm45Parser,
                               Qwen3CoderParser)}
SCHEMA_AWARE = (Glm45Parser, Qwen3CoderParser)     # built with the request's tools' argument types
