"""Anthropic Messages bodies -> the chat request the server already runs: the body is checked in Anthropic's terms,
translated into a chat completion body and parsed by ``chat_request.parse_chat_request``, so templates, tools,
tool choice, reasoning and sampling behave exactly as on /v1/chat/completions.

* ``max_tokens`` (required), ``temperature``, ``top_p``, ``top_k``, ``stream``: the same fields; ``stop_sequences``
  -> ``stop``; ``metadata.user_id``: informational.
* ``tools`` -> function tools (``input_schema`` -> ``parameters``); ``tool_choice`` ``auto`` / ``any`` / ``tool`` /
  ``none`` -> ``auto`` (the server's --tool-call-parser) / ``required`` / a named function (grammar-constrained) /
  ``none``; ``disable_parallel_tool_use`` -> ``parallel_tool_calls: false``.
* ``thinking`` -> the template's switch (``enable_thinking`` and ``thinking``, the names Qwen3, GLM and DeepSeek
  templates read) and the server's --reasoning-parser, which splits the answer's thinking block off.
* ``output_config.format`` (a JSON schema) -> ``response_format``.

An error from the chat parser is reworded to name the Anthropic field it came from.
"""
from __future__ import annotations

from gh200rt.serve.chat_request import parse_chat_request
from gh200rt.serve.errors import APIError, bad_request
from gh200rt.serve.fields import declared, refuse_unhonoured
from gh200rt.serve.messages_content import chat_messages, check_cache_control
from gh200rt.serve.messages_fields import (COUNT_TOKENS, COUNT_TOKENS_REFUSED, MESSAGES, REFUSED, TOOL_CHOICE_KEYS,
                                           TOOL_KEYS, TOOL_REFUSED)
from gh200rt.serve.protocol import ParsedRequest, show
from gh200rt.serve.tool_parsers import PARSERS as TOOL_PARSERS

MIN_THINKING_BUDGET = 1024          # Anthropic's own lower bound
THINKING_DISPLAY = (None, "summarized")
# chat field -> the Anthropic field it was translated from, for the chat parser's errors
ANTHROPIC_NAMES = {"stop": "stop_sequences", "parallel_tool_calls": "tool_choice", "chat_template_kwargs": "thinking",
                   "response_format": "output_config", "continue_final_message": "messages"}


def _tool(tool, i: int) -> dict:
    """An Anthropic client tool as a chat function tool."""
    at = f"tools[{i}]"
    if not isinstance(tool, dict):
        raise bad_request(f"'{at}' must be a tool {{\"name\", \"description\", \"input_schema\"}}, got {show(tool)}",
                          "tools")
    if tool.get("type") not in (None, "custom"):
        raise bad_request(f"'{at}': {tool['type']!r} is a server tool, run by Anthropic's API; this server runs no "
                          "tools itself: define it as a client tool (name, description, input_schema) and run it on "
                          "the client", "tools")
    unknown = [key for key in tool if key not in TOOL_KEYS and key not in TOOL_REFUSED]
    if unknown:
        raise bad_request(f"'{at}' has the unknown key {unknown[0]!r}: a tool holds {', '.join(TOOL_KEYS)}", "tools")
    refuse_unhonoured(tool, TOOL_REFUSED)
    if not isinstance(tool.get("name"), str) or not tool["name"]:
        raise bad_request(f"'{at}.name' must be a non-empty string, got {show(tool.get('name'))}", "tools")
    if not isinstance(tool.get("description", ""), str):
        raise bad_request(f"'{at}.description' must be a string", "tools")
    schema = tool.get("input_schema")
    if not isinstance(schema, dict) or schema.get("type") != "object":
        raise bad_request(f"'{at}.input_schema' must be a JSON schema of an object ({{\"type\": \"object\", ...}}), "
                          f"got {show(schema)}", "tools")
    if not isinstance(tool.get("strict", False), bool):
        raise bad_request(f"'{at}.strict' must be true or false", "tools")
    check_cache_control(tool.get("cache_control"), f"{at}.cache_control", "tools")
    function = {"name": tool["name"], "parameters": schema}
    if tool.get("description"):
        function["description"] = tool["description"]
    return {"type": "function", "function": function}


def chat_tools(tools) -> list[dict]:
    if not isinstance(tools, list) or not tools:
        raise bad_request(f"'tools' must be a non-empty list of tools, got {show(tools)}", "tools")
    result = [_tool(tool, i) for i, tool in enumerate(tools)]
    names = [t["function"]["name"] for t in result]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise bad_request(f"'tools' names {twice[0]!r} more than once; tool names must be unique", "tools")
    return result


def chat_tool_choice(choice, tools: list | None, auto_enabled: bool) -> tuple[str | dict, bool]:
    """(the chat tool_choice, parallel_tool_calls) for Anthropic's ``tool_choice`` (default ``auto``)."""
    choice = {"type": "auto"} if choice is None else choice
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind not in TOOL_CHOICE_KEYS:
        raise bad_request("'tool_choice' must be {\"type\": \"auto\"}, {\"type\": \"any\"}, {\"type\": \"tool\", "
                          f"\"name\": ...}} or {{\"type\": \"none\"}}, got {show(choice)}", "tool_choice")
    unknown = [key for key in choice if key not in TOOL_CHOICE_KEYS[kind]]
    if unknown:
        raise bad_request(f"'tool_choice' has the unknown key {unknown[0]!r}: a {kind!r} choice holds "
                          f"{', '.join(TOOL_CHOICE_KEYS[kind])}", "tool_choice")
    disable = choice.get("disable_parallel_tool_use", False)
    if not isinstance(disable, bool):
        raise bad_request("'tool_choice.disable_parallel_tool_use' must be true or false", "tool_choice")
    if kind == "tool":
        names = [t["function"]["name"] for t in tools or []]
        if choice.get("name") not in names:
            raise bad_request(f"'tool_choice.name' is {show(choice.get('name'))}, which is not among the tools "
                              f"{names}", "tool_choice")
        return {"type": "function", "function": {"name": choice["name"]}}, not disable
    if kind == "auto" and tools and not auto_enabled:
        raise bad_request("'tool_choice' {\"type\": \"auto\"} (the default with tools) needs the server started with "
                          f"--enable-auto-tool-choice and --tool-call-parser ({', '.join(TOOL_PARSERS)}); send "
                          "{\"type\": \"any\"}, {\"type\": \"tool\", \"name\": ...} or {\"type\": \"none\"}",
                          "tool_choice")
    return {"auto": "auto", "any": "required", "none": "none"}[kind], not disable


def template_switch(thinking, max_tokens: int | None, reasoning_parser: str | None, constrained: bool,
                    count_only: bool) -> dict | None:
    """The chat_template_kwargs that turn the template's thinking on or off (None: the template's default).

    ``enabled`` and ``adaptive`` need a --reasoning-parser (else the thinking would come back as text). The server
    cannot end the thinking apart from the answer, so a ``budget_tokens`` below ``max_tokens`` is refused:
    ``max_tokens`` bounds both, so a budget of at least ``max_tokens`` holds, and ``adaptive`` leaves the length to
    the model, as Anthropic defines it."""
    if thinking is None:
        return None
    kind = thinking.get("type") if isinstance(thinking, dict) else None
    if kind == "disabled" and set(thinking) == {"type"}:
        return {"enable_thinking": False, "thinking": False}
    if kind not in ("enabled", "adaptive"):
        raise bad_request("'thinking' must be {\"type\": \"enabled\", \"budget_tokens\": N}, {\"type\": "
                          f"\"adaptive\"}} or {{\"type\": \"disabled\"}}, got {show(thinking)}", "thinking")
    keys = ("type", "budget_tokens", "display") if kind == "enabled" else ("type", "display")
    unknown = [key for key in thinking if key not in keys]
    if unknown:
        raise bad_request(f"'thinking' has the unknown key {unknown[0]!r}: {kind!r} thinking holds "
                          f"{', '.join(keys)}", "thinking")
    if thinking.get("display") not in THINKING_DISPLAY:
        raise bad_request("'thinking.display': this server returns the thinking as generated (\"summarized\"); it "
                          "has no redacted form; leave 'display' out or \"summarized\"", "thinking")
    if kind == "enabled":
        budget = thinking.get("budget_tokens")
        if isinstance(budget, bool) or not isinstance(budget, int) or budget < MIN_THINKING_BUDGET:
            raise bad_request(f"'thinking.budget_tokens' must be an integer of at least {MIN_THINKING_BUDGET}, got "
                              f"{show(budget)}", "thinking")
        if not count_only and isinstance(max_tokens, int) and budget < max_tokens:
            raise bad_request(f"'thinking.budget_tokens' ({budget}) is below 'max_tokens' ({max_tokens}): this "
                              "server cannot end the thinking apart from the answer, only 'max_tokens' bounds both; "
                              "send {\"type\": \"adaptive\"} (the model decides how long it thinks) or a budget of "
                              "at least max_tokens", "thinking")
    if not count_only and reasoning_parser is None:
        raise bad_request(f"'thinking' {{\"type\": \"{kind}\"}} needs the server started with --reasoning-parser, "
                          "which splits the thinking from the answer; leave 'thinking' out or send "
                          "{\"type\": \"disabled\"}", "thinking")
    if constrained:
        raise bad_request(f"'thinking' {{\"type\": \"{kind}\"}} cannot be used with a 'tool_choice' of \"any\" or "
                          "\"tool\", or an 'output_config.format', as Anthropic's API refuses them together; leave "
                          "'thinking' out (a template that thinks by default still thinks before the constrained "
                          "answer)", "thinking")
    return {"enable_thinking": True, "thinking": True}


def response_format(config) -> dict | None:
    if config is None:
        return None
    if not isinstance(config, dict) or set(config) - {"effort", "format"}:
        raise bad_request(f"'output_config' must be an object with an optional 'format', got {show(config)}",
                          "output_config")
    if config.get("effort") is not None:
        raise bad_request("'output_config.effort': this server has no effort control (the model thinks as its "
                          "template and 'thinking' say); leave 'effort' out", "output_config")
    fmt = config.get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema" or not isinstance(fmt.get("schema"), dict) \
            or set(fmt) - {"type", "schema"}:
        raise bad_request("'output_config.format' must be {\"type\": \"json_schema\", \"schema\": {...}}, got "
                          f"{show(fmt)}", "output_config")
    return {"type": "json_schema", "json_schema": {"name": "output", "schema": fmt["schema"]}}


def _metadata(metadata) -> None:
    if metadata is None:
        return
    if not isinstance(metadata, dict) or set(metadata) - {"user_id"} or \
            not isinstance(metadata.get("user_id", ""), (str, type(None))):
        raise bad_request(f"'metadata' must be {{\"user_id\": string or null}}, got {show(metadata)}", "metadata")


def _stop_sequences(stop) -> list[str]:
    if stop is None:
        return []
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
        raise bad_request(f"'stop_sequences' must be a list of non-empty strings, got {show(stop)}", "stop_sequences")
    return stop


def _in_anthropic_terms(e: APIError) -> APIError:
    name = ANTHROPIC_NAMES.get(e.param)
    message = e.message.replace("'parameters' schema", "'input_schema'")
    if name is not None:
        message = message.replace(f"'{e.param}'", f"'{name}'")
    return APIError(e.status, message, name or e.param, e.code, e.headers)


def to_chat_body(body: dict, auto_tool_choice: bool, reasoning_parser: str | None, count_only: bool) -> dict:
    """The chat completion body that asks for what the Messages body asks for."""
    if not isinstance(body.get("model"), str) or not body["model"]:
        raise bad_request(f"'model' is required: a string (a name from GET /v1/models), got {show(body.get('model'))}",
                          "model")
    max_tokens = None if count_only else body.get("max_tokens")
    if not count_only and max_tokens is None:
        raise bad_request("'max_tokens' is required: the most tokens to generate, at least 1", "max_tokens")
    messages = chat_messages(body.get("system"), body.get("messages"))
    check_cache_control(body.get("cache_control"), "cache_control", "cache_control")
    chat = {"model": body["model"], "messages": messages}
    if messages[-1]["role"] == "assistant":              # Anthropic continues a final assistant turn
        chat.update(continue_final_message=True, add_generation_prompt=False)
    if not count_only:
        chat.update({name: body[name] for name in ("max_tokens", "temperature", "top_p", "top_k", "stream")
                     if body.get(name) is not None})
        stop = _stop_sequences(body.get("stop_sequences"))
        if stop:
            chat["stop"] = stop
        _metadata(body.get("metadata"))
    tools = chat_tools(body["tools"]) if body.get("tools") is not None else None
    choice, parallel = chat_tool_choice(body.get("tool_choice"), tools, auto_tool_choice or count_only)
    if tools is not None:
        # counting renders the same prompt whatever the choice; "none" needs no --tool-call-parser
        chat.update(tools=tools, tool_choice="none" if count_only else choice, parallel_tool_calls=parallel)
        if not count_only and choice == "auto" and any(t.get("strict") for t in body["tools"]):
            raise bad_request("a tool with 'strict': true needs a 'tool_choice' of \"any\" or \"tool\", whose inputs "
                              "are grammar-constrained to the schema; \"auto\" calls are read from free text",
                              "tools")
    elif choice not in ("auto", "none"):
        raise bad_request("'tool_choice' needs 'tools'", "tool_choice")
    fmt = response_format(body.get("output_config"))
    if fmt is not None:
        chat["response_format"] = fmt
    constrained = tools is not None and choice not in ("auto", "none") or fmt is not None
    switch = template_switch(body.get("thinking"), max_tokens, reasoning_parser, constrained, count_only)
    if switch is not None:
        chat["chat_template_kwargs"] = switch
    return chat


def parse_messages_request(body: dict, tool_call_parser: str | None, auto_tool_choice: bool, max_logprobs: int,
                           reasoning_parser: str | None, count_only: bool = False
                           ) -> tuple[ParsedRequest, list[dict]]:
    """(the parsed chat request, its chat messages) for a /v1/messages (or, ``count_only``, count_tokens) body."""
    fields, refused = (COUNT_TOKENS, COUNT_TOKENS_REFUSED) if count_only else (MESSAGES, REFUSED)
    route = "/v1/messages/count_tokens" if count_only else "/v1/messages"
    body = declared(body, fields, route)
    refuse_unhonoured(body, refused)
    chat = to_chat_body(body, auto_tool_choice, reasoning_parser, count_only)
    try:
        return parse_chat_request(chat, tool_call_parser, auto_tool_choice, max_logprobs, reasoning_parser)
    except APIError as e:
        raise _in_anthropic_terms(e) from None
