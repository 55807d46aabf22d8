"""Chat templates rendered the way transformers renders them (sandboxed jinja2, trim/lstrip blocks,
``raise_exception``, ``tojson`` without HTML escaping, ``strftime_now``, special tokens as variables)."""
from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment


def _raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt):
    return datetime.now().strftime(fmt)


@lru_cache(maxsize=8)
def compile_template(source: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    try:
        return env.from_string(source)
    except jinja2.exceptions.TemplateSyntaxError as e:
        raise ValueError(f"the chat template is not valid jinja (line {e.lineno}): {e.message}") from e


def validate_messages(messages) -> list[dict]:
    if not isinstance(messages, (list, tuple)) or not messages:
        raise ValueError("messages must be a non-empty list of {'role': ..., 'content': ...} dicts")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or "role" not in message:
            raise ValueError(f"message {i} must be a dict with a 'role' and 'content', got {message!r}")
        if not isinstance(message["role"], str):
            raise ValueError(f"message {i} has a non-string role {message['role']!r}")
    return [dict(m) for m in messages]


def render_chat(source: str, messages, add_generation_prompt: bool, special_tokens: dict,
                continue_final_message: bool = False, **extra) -> str:
    """``continue_final_message``: the text ends inside the final (assistant) message, so the model goes on
    writing it (assistant prefill), as transformers does: whatever the template adds after that
    message's content (end-of-turn tokens) is cut off."""
    template = compile_template(source)
    variables = {**special_tokens, **extra}
    messages = validate_messages(messages)
    if continue_final_message and add_generation_prompt:
        raise ValueError("continue_final_message and add_generation_prompt exclude each other")
    try:
        text = template.render(messages=messages, tools=variables.pop("tools", None),
                               documents=variables.pop("documents", None),
                               add_generation_prompt=add_generation_prompt, **variables)
    except jinja2.exceptions.TemplateError as e:
        raise ValueError(f"the chat template rejected these messages: {e}") from e
    return _cut_after_final_message(text, messages[-1]) if continue_final_message else text


def _cut_after_final_message(text: str, final: dict) -> str:
    content = final.get("content")
    if not isinstance(content, str) or not content.strip():
        raise ValueError("continue_final_message needs a final message with text to continue")
    end = text.rfind(content.strip())
    if end < 0:
        raise ValueError("continue_final_message: the template does not render the final message's text verbatim")
    return text[:end + len(content.strip())]
