"""/v1/responses bodies (OpenAI's Responses API) read as the chat completion they ask for.

``parse_responses_request(body, history)`` checks the Responses fields and returns ``ResponsesRequest``: the chat
completion body the chat path parses (``chat_request.py``) — messages from ``instructions``, the previous response's
conversation (``history``) and ``input``; function tools nested back as chat nests them; ``text.format`` as
``response_format``; ``max_output_tokens`` as ``max_tokens`` — and what the answer must echo. An item or field the
chat path has no place for is a 400 naming it, as on the other routes.

Input items: messages (``input_text`` / ``output_text`` / ``refusal`` parts), ``function_call`` (joined to the
assistant turn before it), ``function_call_output`` (a tool message), ``reasoning`` (the next assistant turn's
``reasoning_content``, for templates that show earlier thinking).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from gh200rt.serve.errors import bad_request
from gh200rt.serve.fields import RESPONSES, RESPONSES_REFUSED, declared, refuse_unhonoured
from gh200rt.serve.protocol import show

ROLES = ("user", "system", "developer", "assistant")
TEXT_PARTS = ("input_text", "output_text", "text", "refusal")
UNSUPPORTED_PARTS = ("input_image", "input_file", "input_audio")
EFFORTS_REFUSED = ("minimal", "low", "medium", "high", "xhigh")
INCLUDES = ("message.output_text.logprobs",)
# vLLM's sampling extensions the chat path honours, taken on /v1/responses as on chat (not OpenAI's fields)
SAMPLING_EXTRAS = ("top_k", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty", "seed", "stop",
                   "stop_token_ids", "ignore_eos", "min_tokens")


@dataclass
class ResponsesRequest:
    chat: dict                          # the chat completion body the chat path parses
    conversation: list[dict]            # the chat messages without the instructions: what a stored response keeps
    echo: dict = field(default_factory=dict)   # fields the response object repeats
    input_items: list = field(default_factory=list)
    store: bool = True
    stream: bool = False
    previous_response_id: str | None = None


def _text(content, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad_request(f"{where}.content must be a string or a list of text parts", "input")
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in UNSUPPORTED_PARTS:
            raise bad_request(f"{where}.content[{j}]: '{kind}' parts are not supported by this server (text-only "
                              f"models); send input_text parts", "input")
        text = part.get("text", part.get("refusal")) if isinstance(part, dict) else None
        if kind not in TEXT_PARTS or not isinstance(text, str):
            raise bad_request(f"{where}.content[{j}] must be {{\"type\": \"input_text\", \"text\": ...}} (an "
                              f"assistant's: output_text)", "input")
        texts.append(text)
    return "".join(texts)


def _assistant_turn(messages: list[dict], pending: list[str]) -> dict:
    """The assistant message a function call joins: the last message when it is the assistant's, else a new one."""
    if not messages or messages[-1]["role"] != "assistant":
        messages.append({"role": "assistant", "content": ""})
    if pending:
        messages[-1]["reasoning_content"] = pending.pop()
    return messages[-1]


def input_messages(value) -> list[dict]:
    """The chat messages of ``input`` (a string, or a list of items)."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise bad_request("'input' must be a string or a non-empty list of items (messages, function_call, "
                          "function_call_output)", "input")
    messages: list[dict] = []
    pending: list[str] = []                 # a reasoning item's text, for the assistant turn that follows it
    for i, item in enumerate(value):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise bad_request(f"{where} must be an object (a message or another item)", "input")
        kind = item.get("type", "message")
        if kind == "message":
            if item.get("role") not in ROLES:
                raise bad_request(f"{where} needs a 'role' among {', '.join(ROLES)}", "input")
            message = {"role": item["role"], "content": _text(item.get("content"), where)}
            if item["role"] == "assistant" and pending:
                message["reasoning_content"] = pending.pop()
            messages.append(message)
        elif kind == "function_call":
            name, call_id, arguments = item.get("name"), item.get("call_id"), item.get("arguments", "{}")
            if not isinstance(name, str) or not isinstance(call_id, str) or not isinstance(arguments, str):
                raise bad_request(f"{where}: a function_call needs 'call_id', 'name' and 'arguments' (a JSON "
                                  f"string)", "input")
            turn = _assistant_turn(messages, pending)
            turn.setdefault("tool_calls", []).append(
                {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}})
        elif kind == "function_call_output":
            if not isinstance(item.get("call_id"), str):
                raise bad_request(f"{where}: a function_call_output needs the 'call_id' of its call", "input")
            messages.append({"role": "tool", "tool_call_id": item["call_id"],
                             "content": _text(item.get("output", ""), where)})
        elif kind == "reasoning":
            parts = item.get("content") or item.get("summary") or []
            if not isinstance(parts, list) or not all(isinstance(p, dict) and isinstance(p.get("text"), str)
                                                      for p in parts):
                raise bad_request(f"{where}: a reasoning item's 'content' is a list of reasoning_text parts", "input")
            pending[:] = ["".join(p["text"] for p in parts)]
        elif kind == "item_reference":
            raise bad_request(f"{where}: item references are not supported by this server; send the item itself, "
                              f"or continue a stored response with 'previous_response_id'", "input")
        else:
            raise bad_request(f"{where}: '{kind}' items are not supported by this server (it runs function tools "
                              f"only); send messages, function_call and function_call_output items", "input")
    return messages


def _tools(tools) -> list[dict] | None:
    """Responses' flat function tools as chat nests them."""
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise bad_request("'tools' must be a list of function tools", "tools")
    nested = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type") != "function":
            kind = tool.get("type") if isinstance(tool, dict) else None
            raise bad_request(f"tools[{i}]: {show(kind)} tools are not supported by this server (no hosted tools: "
                              f"web search, file search, code interpreter, MCP, computer use); send "
                              f"{{\"type\": \"function\", \"name\": ..., \"parameters\": {{...}}}}", "tools")
        if not isinstance(tool.get("name"), str) or not tool["name"]:
            raise bad_request(f"tools[{i}] needs a 'name'", "tools")
        nested.append({"type": "function", "function": {k: tool[k] for k in ("name", "description", "parameters",
                                                                             "strict") if tool.get(k) is not None}})
    return nested or None


def _tool_choice(choice):
    if choice is None or choice in ("none", "auto", "required"):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise bad_request("'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"name\": "
                      "...} (this server has no hosted tools)", "tool_choice")


def _response_format(text) -> dict | None:
    if text is None:
        return None
    if not isinstance(text, dict) or set(text) - {"format", "verbosity"}:
        raise bad_request("'text' takes 'format' ({\"type\": \"text\" | \"json_object\" | \"json_schema\", ...})",
                          "text")
    if text.get("verbosity") not in (None, "medium"):
        raise bad_request("answer verbosity is not adjustable on this server; leave 'text.verbosity' out",
                          "text.verbosity")
    fmt = text.get("format")
    if fmt is None or fmt == {"type": "text"}:
        return None
    if isinstance(fmt, dict) and fmt.get("type") == "json_object":
        return {"type": "json_object"}
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema" and isinstance(fmt.get("schema"), dict):
        return {"type": "json_schema", "json_schema": {k: fmt[k] for k in ("name", "schema", "strict", "description")
                                                       if fmt.get(k) is not None}}
    raise bad_request("'text.format' must be {\"type\": \"text\"}, {\"type\": \"json_object\"} or {\"type\": "
                      "\"json_schema\", \"name\": ..., \"schema\": {...}}", "text.format")


def _reasoning(value) -> dict:
    """Template options for ``reasoning``: effort "none" turns a template's thinking off; a summary is "auto" at
    most (the reasoning itself is returned; no summary is written)."""
    if value is None:
        return {}
    if not isinstance(value, dict) or set(value) - {"effort", "summary", "generate_summary"}:
        raise bad_request("'reasoning' takes 'effort' and 'summary'", "reasoning")
    effort = value.get("effort")
    if effort in EFFORTS_REFUSED:
        raise bad_request(f"this server has no reasoning-effort control ({show(effort)}); leave 'reasoning.effort' "
                          f"out, or \"none\" to turn a thinking template's reasoning off", "reasoning.effort")
    if effort not in (None, "none"):
        raise bad_request(f"'reasoning.effort' must be \"none\" or left out, got {show(effort)}", "reasoning.effort")
    for name in ("summary", "generate_summary"):
        if value.get(name) not in (None, "auto"):
            raise bad_request(f"reasoning summaries are not written by this server; the reasoning itself is "
                              f"returned (with --reasoning-parser): leave 'reasoning.{name}' out or \"auto\"",
                              f"reasoning.{name}")
    return {"enable_thinking": False} if effort == "none" else {}


def _include(body) -> bool:
    """Whether ``include`` asks for the output text's logprobs."""
    include = body.get("include") or []
    if not isinstance(include, list) or not all(isinstance(x, str) for x in include):
        raise bad_request("'include' must be a list of strings", "include")
    for name in include:
        if name not in INCLUDES:
            raise bad_request(f"'include' {show(name)} is not available on this server (it returns "
                              f"{', '.join(INCLUDES)}; reasoning is returned as text, never encrypted)", "include")
    return bool(include)


def parse_responses_request(body: dict, history: list[dict] | None = None) -> ResponsesRequest:
    """``history``: the stored conversation of ``previous_response_id`` (looked up by the route)."""
    body = declared(body, RESPONSES, "/v1/responses")
    refuse_unhonoured(body, RESPONSES_REFUSED)
    for name in ("store", "stream", "parallel_tool_calls", "background"):
        if name in body and body[name] is not None and not isinstance(body[name], bool):
            raise bad_request(f"'{name}' must be true or false, got {show(body[name])}", name)
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise bad_request("'instructions' must be a string (a system message put before the input)", "instructions")
    max_output = body.get("max_output_tokens")
    if max_output is not None and (isinstance(max_output, bool) or not isinstance(max_output, int)
                                   or max_output < 1):
        raise bad_request(f"'max_output_tokens' must be a positive integer, got {show(max_output)}",
                          "max_output_tokens")
    stream_options = body.get("stream_options")
    if stream_options not in (None, {}) and stream_options != {"include_obfuscation": False}:
        raise bad_request("this server pads no stream events (no obfuscation); leave 'stream_options' out or "
                          "{\"include_obfuscation\": false}", "stream_options")
    conversation = list(history or []) + input_messages(body.get("input"))
    messages = ([{"role": "system", "content": instructions}] if instructions else []) + conversation
    wants_logprobs = _include(body) or body.get("top_logprobs") is not None
    chat = {"model": body.get("model"), "messages": messages, "max_tokens": max_output,
            "temperature": body.get("temperature"), "top_p": body.get("top_p"), "tools": _tools(body.get("tools")),
            "tool_choice": _tool_choice(body.get("tool_choice")),
            "parallel_tool_calls": body.get("parallel_tool_calls"),
            "response_format": _response_format(body.get("text")),
            "logprobs": True if wants_logprobs else None,
            "top_logprobs": body.get("top_logprobs") if wants_logprobs else None,
            "user": body.get("user"), "safety_identifier": body.get("safety_identifier"),
            "metadata": body.get("metadata"), "chat_template_kwargs": _reasoning(body.get("reasoning")) or None,
            **{name: body.get(name) for name in SAMPLING_EXTRAS}}
    chat = {k: v for k, v in chat.items() if v is not None}
    echo = {name: body.get(name) for name in ("instructions", "max_output_tokens", "metadata", "reasoning", "text",
                                              "tool_choice", "tools", "top_logprobs", "user", "safety_identifier",
                                              "temperature", "top_p", "parallel_tool_calls", "previous_response_id")}
    items = body.get("input")
    return ResponsesRequest(chat, conversation, echo,
                            [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": items}]}]
                            if isinstance(items, str) else list(items),
                            store=body.get("store") is not False, stream=body.get("stream") is True,
                            previous_response_id=body.get("previous_response_id"))
