"""Tool calling on /v1/chat/completions: ``tools`` and ``tool_choice`` parsed and checked, the
constraint that makes ``required`` and named choices valid by construction, and the assistant message
(``tool_calls``) built from the generated text.

* ``none``: tools are shown to the template, the answer is plain text.
* ``auto``: the model decides; the server's ``--tool-call-parser`` reads its calls out of the text.
* ``required``: the answer is constrained to ``[{"name": ..., "parameters": {...}}, ...]`` (at least one
  call, each valid for its tool's schema; exactly one with ``parallel_tool_calls: false``), as vLLM does.
* a named function: the answer is constrained to that tool's ``parameters`` schema.
"""
from __future__ import annotations

import json
import uuid
from dataclasses import dataclass

from gh200rt.serve.errors import bad_request
from gh200rt.serve.tool_parsers import PARSERS, SCHEMA_AWARE, ParsedToolCall
from gh200rt.structured import Constraint

TOOL_FIELDS = ("tools", "tool_choice", "parallel_tool_calls")


@dataclass
class ToolRequest:
    tools: list[dict]               # as sent: {"type": "function", "function": {...}}
    choice: str                     # "none", "auto", "required" or "named"
    named: str | None = None
    parser: str | None = None       # for "auto"
    parallel: bool = True           # parallel_tool_calls: false allows one call only

    @property
    def parses_output(self) -> bool:
        return self.choice != "none"


def _function(tool, i: int) -> dict:
    fn = tool.get("function") if isinstance(tool, dict) and tool.get("type", "function") == "function" else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
        raise bad_request(f"tools[{i}] must be {{\"type\": \"function\", \"function\": {{\"name\": ..., "
                          "\"parameters\": {...}}}}", "tools")
    params = fn.get("parameters", {"type": "object"})
    if not isinstance(params, dict):
        raise bad_request(f"tools[{i}].function.parameters must be a JSON schema object", "tools")
    return fn


def parse_tools(body: dict, parser: str | None, auto_enabled: bool) -> ToolRequest | None:
    tools, choice = body.get("tools"), body.get("tool_choice")
    if tools is None:
        if choice not in (None, "none"):
            raise bad_request("'tool_choice' needs 'tools'", "tool_choice")
        return None
    if not isinstance(tools, list) or not tools:
        raise bad_request("'tools' must be a non-empty list of function tools", "tools")
    functions = [_function(t, i) for i, t in enumerate(tools)]
    names = [f["name"] for f in functions]
    parallel = body.get("parallel_tool_calls", True)
    if not isinstance(parallel, bool):
        raise bad_request("'parallel_tool_calls' must be true or false", "parallel_tool_calls")
    if choice is None:
        choice = "auto"
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name") if isinstance(choice.get("function"), dict) else None
        if name not in names:
            raise bad_request(f"'tool_choice' names {name!r}, which is not among the tools {names}", "tool_choice")
        return ToolRequest(tools, "named", named=name)
    if choice not in ("none", "auto", "required"):
        raise bad_request("'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", "
                          "\"function\": {\"name\": ...}}", "tool_choice")
    if choice == "auto" and not auto_enabled:
        raise bad_request("\"auto\" tool choice needs the server started with --enable-auto-tool-choice and "
                          f"--tool-call-parser ({', '.join(PARSERS)}); send \"tool_choice\": \"required\", a named "
                          "function or \"none\"", "tool_choice")
    return ToolRequest(tools, choice, parser=parser if choice == "auto" else None, parallel=parallel)


def tool_constraint(request: ToolRequest) -> Constraint | None:
    functions = {t["function"]["name"]: t["function"].get("parameters", {"type": "object"}) for t in request.tools}
    if request.choice == "named":
        return Constraint.json_schema(functions[request.named])
    if request.choice == "required":
        one_call = [{"type": "object", "additionalProperties": False, "required": ["name", "parameters"],
                     "properties": {"name": {"const": name}, "parameters": schema}}
                    for name, schema in functions.items()]
        calls = {"type": "array", "minItems": 1, "items": {"anyOf": one_call}}
        return Constraint.json_schema(calls if request.parallel else {**calls, "maxItems": 1})
    return None


def split_tool_calls(request: ToolRequest, text: str) -> tuple[str | None, list[ParsedToolCall]]:
    """(content, tool calls) of a finished answer."""
    if request.choice == "named":
        return None, [ParsedToolCall(request.named, text)]
    if request.choice == "required":
        try:
            calls = json.loads(text)
        except ValueError:                    # cut short by max_tokens or a stop string
            return text, []
        return None, [ParsedToolCall(c["name"], json.dumps(c["parameters"], ensure_ascii=False)) for c in calls]
    if request.choice == "auto":
        content, calls = auto_parser(request).parse(text)
        return content, calls if request.parallel else calls[:1]     # parallel_tool_calls: false
    return text, []


def auto_parser(request: ToolRequest):
    """The server's --tool-call-parser for this request (GLM's and Qwen3-Coder's read the tools' argument types:
    their calls write values bare)."""
    parser = PARSERS[request.parser]
    if parser in SCHEMA_AWARE:
        return parser({t["function"]["name"]: {key: schema.get("type") for key, schema in
                                               (t["function"].get("parameters") or {}).get("properties", {}).items()
                                               if isinstance(schema, dict) and isinstance(schema.get("type"), str)}
                       for t in request.tools})
    return parser()


def tool_call_dicts(calls: list[ParsedToolCall], with_index: bool = False) -> list[dict]:
    return [{**({"index": i} if with_index else {}), "id": f"chatcmpl-tool-{uuid.uuid4().hex}", "type": "function",
             "function": {"name": c.name, "arguments": c.arguments}} for i, c in enumerate(calls)]
