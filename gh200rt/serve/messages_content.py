"""Anthropic's ``system`` and ``messages`` -> the chat messages the template renders (the shape
``chat_request.parse_messages`` takes):

* ``system`` (a string or text blocks) -> a leading ``system`` message;
* a ``user`` turn's text blocks -> a ``user`` message; each ``tool_result`` block -> a ``tool`` message (its
  ``tool_call_id``, and the ``name`` of the ``tool_use`` it answers), in block order; ``is_error`` is said in words
  ("Error: ...") since templates have no field for it;
* an ``assistant`` turn's text -> ``content``, its ``tool_use`` blocks -> ``tool_calls``, its ``thinking`` blocks ->
  ``reasoning_content`` (for templates that show an earlier turn's reasoning).

``cache_control`` is accepted on every block: it asks for prompt caching, which the server's prefix cache does for
every prompt. Block types the server cannot read (images, documents, redacted thinking, ...) are a 400 saying so.
"""
from __future__ import annotations

from gh200rt.serve.errors import bad_request
from gh200rt.serve.messages_fields import ASSISTANT_BLOCKS, BLOCK_KEYS, UNREADABLE_BLOCKS, USER_BLOCKS
from gh200rt.serve.protocol import show

ROLES = ("user", "assistant")


def check_cache_control(value, name: str, param: str) -> None:
    """Anthropic's prompt-caching hint: honoured by the prefix cache, which caches every prompt's blocks anyway."""
    if value is None:
        return
    if not isinstance(value, dict) or value.get("type") != "ephemeral" or value.get("ttl") not in (None, "5m", "1h") \
            or set(value) - {"type", "ttl"}:
        raise bad_request(f"'{name}' must be {{\"type\": \"ephemeral\"}} with an optional 'ttl' of \"5m\" or "
                          f"\"1h\", got {show(value)}", param)


def blocks(content, where: str, param: str, allowed: tuple[str, ...]) -> list[dict]:
    """``content`` (a string or a list of blocks) as checked blocks of the ``allowed`` types."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise bad_request(f"'{where}' must be a string or a list of content blocks, got {show(content)}", param)
    result = []
    for j, block in enumerate(content):
        at = f"{where}[{j}]"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind in UNREADABLE_BLOCKS:
            raise bad_request(f"'{at}': {UNREADABLE_BLOCKS[kind]}", param)
        if kind not in allowed:
            raise bad_request(f"'{at}' must be a content block of type {' or '.join(allowed)}, got {show(block)}",
                              param)
        unknown = [key for key in block if key not in BLOCK_KEYS[kind]]
        if unknown:
            raise bad_request(f"'{at}' has the unknown key {unknown[0]!r}: a {kind} block holds "
                              f"{', '.join(BLOCK_KEYS[kind])}", param)
        check_cache_control(block.get("cache_control"), f"{at}.cache_control", param)
        result.append(block)
    return result


def text_of(block: dict, at: str, param: str) -> str:
    if not isinstance(block.get("text"), str):
        raise bad_request(f"'{at}.text' must be a string, got {show(block.get('text'))}", param)
    if block.get("citations"):
        raise bad_request(f"'{at}.citations': citations are not supported by this server; leave them out", param)
    return block["text"]


def system_message(system) -> list[dict]:
    if system is None:
        return []
    text = "".join(text_of(b, f"system[{j}]", "system") for j, b in enumerate(blocks(system, "system", "system",
                                                                                      ("text",))))
    return [{"role": "system", "content": text}] if text else []


def _tool_result(block: dict, at: str, names: dict[str, str]) -> dict:
    if not isinstance(block.get("tool_use_id"), str) or not block["tool_use_id"]:
        raise bad_request(f"'{at}.tool_use_id' must be the id of a tool_use block, got "
                          f"{show(block.get('tool_use_id'))}", "messages")
    if not isinstance(block.get("is_error", False), bool):
        raise bad_request(f"'{at}.is_error' must be true or false", "messages")
    content = block.get("content", "")
    parts = blocks(content, f"{at}.content", "messages", ("text",))
    text = "".join(text_of(b, f"{at}.content[{j}]", "messages") for j, b in enumerate(parts))
    message = {"role": "tool", "tool_call_id": block["tool_use_id"],
               "content": f"Error: {text}" if block.get("is_error") else text}
    if block["tool_use_id"] in names:
        message["name"] = names[block["tool_use_id"]]
    return message


def _user_messages(content: list[dict], where: str, names: dict[str, str]) -> list[dict]:
    result, text = [], []
    for j, block in enumerate(content):
        if block["type"] == "text":
            text.append(text_of(block, f"{where}[{j}]", "messages"))
            continue
        if text:
            result.append({"role": "user", "content": "".join(text)})
            text = []
        result.append(_tool_result(block, f"{where}[{j}]", names))
    if text or not result:
        result.append({"role": "user", "content": "".join(text)})
    return result


def _tool_call(block: dict, at: str) -> dict:
    if not isinstance(block.get("id"), str) or not block["id"]:
        raise bad_request(f"'{at}.id' must be the tool_use block's id, got {show(block.get('id'))}", "messages")
    if not isinstance(block.get("name"), str) or not block["name"]:
        raise bad_request(f"'{at}.name' must be the tool's name, got {show(block.get('name'))}", "messages")
    if not isinstance(block.get("input"), dict):
        raise bad_request(f"'{at}.input' must be an object (the tool's arguments), got {show(block.get('input'))}",
                          "messages")
    return {"id": block["id"], "type": "function", "function": {"name": block["name"], "arguments": block["input"]}}


def _assistant_message(content: list[dict], where: str, names: dict[str, str]) -> dict:
    text, calls, thinking = [], [], []
    for j, block in enumerate(content):
        at = f"{where}[{j}]"
        if block["type"] == "text":
            text.append(text_of(block, at, "messages"))
        elif block["type"] == "tool_use":
            calls.append(_tool_call(block, at))
            names[block["id"]] = block["name"]
        else:
            if not isinstance(block.get("thinking"), str):
                raise bad_request(f"'{at}.thinking' must be a string, got {show(block.get('thinking'))}", "messages")
            thinking.append(block["thinking"])
    message = {"role": "assistant", "content": "".join(text)}
    if calls:
        message["tool_calls"] = calls
    if thinking:
        message["reasoning_content"] = "".join(thinking)
    return message


def chat_messages(system, messages) -> list[dict]:
    """The chat messages for the template; a final assistant turn is continued (prefill), so it holds text only."""
    if not isinstance(messages, list) or not messages:
        raise bad_request("'messages' is required: a non-empty list of {\"role\": \"user\" | \"assistant\", "
                          "\"content\": ...} objects", "messages")
    result, names = system_message(system), {}
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict) or message.get("role") not in ROLES:
            got = message.get("role") if isinstance(message, dict) else message
            raise bad_request(f"'{where}.role' must be \"user\" or \"assistant\" (the system prompt goes in "
                              f"'system'), got {show(got)}", "messages")
        unknown = [key for key in message if key not in ("role", "content")]
        if unknown:
            raise bad_request(f"'{where}' has the unknown key {unknown[0]!r}: a message holds 'role' and 'content'",
                              "messages")
        if "content" not in message:
            raise bad_request(f"'{where}.content' is required", "messages")
        user = message["role"] == "user"
        content = blocks(message["content"], f"{where}.content", "messages", USER_BLOCKS if user else ASSISTANT_BLOCKS)
        if user:
            result.extend(_user_messages(content, f"{where}.content", names))
        else:
            result.append(_assistant_message(content, f"{where}.content", names))
    if result[-1]["role"] == "assistant" and result[-1].get("tool_calls"):
        raise bad_request("the final assistant message is continued (prefill), so it may hold text only; answer its "
                          "tool_use blocks with tool_result blocks in a user message", "messages")
    return result
