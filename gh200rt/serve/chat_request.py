"""/v1/chat/completions bodies: messages (text parts, assistant tool calls, tool results), tools and
tool_choice, assistant prefill (``continue_final_message``), ``echo``, the template's own options
(``chat_template``, ``chat_template_kwargs``) and the sampling fields the completions route shares
(``protocol``). Violations are a 400 naming the field."""
from __future__ import annotations

import json

from gh200rt.serve.errors import bad_request
from gh200rt.serve.fields import CHAT, CHAT_REFUSED, declared, refuse_unhonoured
from gh200rt.serve.protocol import (DEFAULT_MAX_LOGPROBS, ParsedRequest, check_temperature, flag, integer,
                                    logprob_count, model_name, response_options, sampling_params, stream_options,
                                    unsupported)
from gh200rt.serve.reasoning import PARSERS as REASONING_PARSERS
from gh200rt.serve.reasoning import ReasoningParser
from gh200rt.serve.tools import parse_tools, tool_constraint

CHAT_ROLES = ("system", "developer", "user", "assistant", "tool")
# What the server itself gives the template from the request's own fields: ``chat_template_kwargs`` may not set it.
TEMPLATE_OWN = ("messages", "tools", "documents", "add_generation_prompt", "continue_final_message", "chat_template")
UNSUPPORTED_PARTS = ("image_url", "input_audio", "video_url", "file")


def _message_text(message: dict, i: int) -> str:
    content = message.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict) and part.get("type") in UNSUPPORTED_PARTS:
                raise bad_request(f"messages[{i}].content: '{part['type']}' parts are not supported by this server "
                                  "(text-only models); send text parts", "messages")
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise bad_request(f"messages[{i}].content: only text parts {{\"type\": \"text\", \"text\": ...}} "
                                  "are supported", "messages")
            parts.append(part["text"])
        return "".join(parts)
    raise bad_request(f"messages[{i}].content must be a string or a list of text parts", "messages")


def _tool_calls(calls, i: int) -> list[dict]:
    """An assistant message's tool calls, with JSON-text arguments turned into objects for the template."""
    if not isinstance(calls, list):
        raise bad_request(f"messages[{i}].tool_calls must be a list", "messages")
    result = []
    for call in calls:
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise bad_request(f"messages[{i}].tool_calls entries need a function with a name", "messages")
        args = fn.get("arguments", {})
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except ValueError:
                raise bad_request(f"messages[{i}].tool_calls: arguments of {fn['name']!r} are not valid JSON",
                                  "messages") from None
        result.append({"id": call.get("id"), "type": "function", "function": {"name": fn["name"], "arguments": args}})
    return result


def parse_messages(messages) -> list[dict]:
    if not isinstance(messages, list) or not messages:
        raise bad_request("'messages' must be a non-empty list of {\"role\", \"content\"} objects", "messages")
    result = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in CHAT_ROLES:
            raise bad_request(f"messages[{i}] needs a 'role' among {', '.join(CHAT_ROLES)}", "messages")
        parsed = {"role": message["role"], "content": _message_text(message, i)}
        if message.get("tool_calls"):
            parsed["tool_calls"] = _tool_calls(message["tool_calls"], i)
        for key in ("tool_call_id", "name"):
            if isinstance(message.get(key), str):
                parsed[key] = message[key]
        # an earlier turn's reasoning, under either name, for templates that show it (interleaved thinking)
        reasoning = message.get("reasoning_content", message.get("reasoning"))
        if isinstance(reasoning, str):
            parsed["reasoning_content"] = reasoning
        result.append(parsed)
    return result


def template_flags(body: dict, messages: list[dict]) -> tuple[bool, bool]:
    """(add_generation_prompt, continue_final_message), as vLLM takes them on chat and /tokenize."""
    for name in ("continue_final_message", "add_generation_prompt"):
        if name in body and not isinstance(body[name], bool):
            raise bad_request(f"'{name}' must be true or false, got {body[name]!r:.60}", name)
    continue_final = flag(body, "continue_final_message")
    add_generation_prompt = flag(body, "add_generation_prompt", not continue_final)
    if continue_final and (add_generation_prompt or messages[-1]["role"] != "assistant"):
        raise bad_request("'continue_final_message' continues a final assistant message: end 'messages' with one "
                          "and leave 'add_generation_prompt' false", "continue_final_message")
    return add_generation_prompt, continue_final


def template_options(body: dict) -> dict:
    """vLLM's ``chat_template`` (a request's own template, used when the server trusts request templates) and
    ``chat_template_kwargs`` (extra variables for the template, e.g. Qwen3's ``enable_thinking``), as keyword
    arguments of ``apply_chat_template``."""
    options = {}
    template = body.get("chat_template")
    if template is not None:
        if not isinstance(template, str) or not template.strip():
            raise bad_request(f"'chat_template' must be a Jinja template (a non-blank string), got "
                              f"{template!r:.60}", "chat_template")
        options["chat_template"] = template
    kwargs = body.get("chat_template_kwargs")
    if kwargs is not None:
        if not isinstance(kwargs, dict):
            raise bad_request(f"'chat_template_kwargs' must be an object of template variables, like "
                              f"{{\"enable_thinking\": false}}, got {kwargs!r:.60}", "chat_template_kwargs")
        own = [k for k in kwargs if k in TEMPLATE_OWN]
        if own:
            raise bad_request(f"'chat_template_kwargs' may not set {own[0]!r}: the server sets it from the "
                              f"request's own '{own[0]}' field", "chat_template_kwargs")
        if kwargs:
            options["template_kwargs"] = dict(kwargs)
    return options


def reasoning_for(body: dict, parser: str | None, template: dict) -> ReasoningParser | None:
    """The reasoning parser that applies to this request: none where the server has none, or where the template is
    told not to think (``enable_thinking`` / ``thinking`` false: its prompt closes the block). A constrained answer
    keeps it: its grammar starts after the block (``generation_routes.start_run`` sets the gate)."""
    kwargs = template.get("template_kwargs") or {}
    if parser is None or kwargs.get("enable_thinking") is False or kwargs.get("thinking") is False:
        return None
    return REASONING_PARSERS[parser]


def parse_chat_request(body: dict, tool_call_parser: str | None = None, auto_tool_choice: bool = False,
                       max_logprobs: int = DEFAULT_MAX_LOGPROBS, reasoning_parser: str | None = None
                       ) -> tuple[ParsedRequest, list[dict]]:
    body = declared(body, CHAT, "/v1/chat/completions")
    messages = parse_messages(body.get("messages"))
    check_temperature(body)
    unsupported(body, chat=True)
    refuse_unhonoured(body, CHAT_REFUSED if reasoning_parser is None else
                      {k: v for k, v in CHAT_REFUSED.items() if k != "include_reasoning"})
    want_logprobs = flag(body, "logprobs")
    top = logprob_count(body, "top_logprobs", max_logprobs)
    n_probs = integer(body, "n_probs", 0, 0, None if max_logprobs == -1 else max_logprobs,
                      f"between 0 and {max_logprobs} (the server's --max-logprobs)")
    if n_probs:         # llama.cpp's name for the same: logprobs on, the top n_probs of each token
        if body.get("logprobs") is False or top is not None and top != n_probs:
            raise bad_request(f"'n_probs' ({n_probs}) asks for the top {n_probs} logprobs but 'logprobs' / "
                              f"'top_logprobs' ask otherwise; send one of them", "n_probs")
        want_logprobs, top = True, n_probs
    if top is not None and not want_logprobs:
        raise bad_request("'top_logprobs' needs 'logprobs': true", "top_logprobs")
    logprobs = (top or 0) if want_logprobs else None
    stream, include_usage, continuous = stream_options(body)
    parsed = ParsedRequest([], sampling_params(body, None, logprobs), stream, include_usage,
                           logprobs=logprobs, model=model_name(body), continuous_usage=continuous,
                           logprobs_param="top_logprobs")
    parsed.logprob_ids = bool(n_probs)
    response_options(parsed, body, max_logprobs)
    tools = parse_tools(body, tool_call_parser, auto_tool_choice)
    constraint = tool_constraint(tools) if tools is not None else None
    if constraint is not None:
        if parsed.params.structured_output is not None:
            raise bad_request("a required or named 'tool_choice' already constrains the answer; leave out "
                              "response_format / structured_outputs", "tool_choice")
        try:
            constraint.check()
        except ValueError as e:
            raise bad_request(f"a tool's 'parameters' schema: {e}", "tools") from None
        parsed.params.structured_output = constraint
    add_generation_prompt, continue_final = template_flags(body, messages)
    parsed.echo = flag(body, "echo")
    parsed.add_special_tokens = flag(body, "add_special_tokens", False)    # the template holds those it wants
    template = template_options(body)
    parsed.extra.update(add_generation_prompt=add_generation_prompt, continue_final_message=continue_final,
                        tools=tools, template_options=template,
                        echo_text=messages[-1]["content"] if messages[-1]["role"] == "assistant" else "",
                        reasoning=reasoning_for(body, reasoning_parser, template),
                        include_reasoning=flag(body, "include_reasoning", True))
    return parsed, messages
