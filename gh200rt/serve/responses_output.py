"""The response object of /v1/responses and its output items, from a finished chat run.

A run's text becomes, in order: a ``reasoning`` item (what --reasoning-parser split off, as ``reasoning_text``
content; no summary is written), a ``message`` item with one ``output_text`` part (its logprobs when ``include``
asked), and a ``function_call`` item per tool call the tool parser read. A run cut by ``max_output_tokens`` is
``incomplete`` (reason ``max_output_tokens``), one cancelled by ``POST /v1/responses/{id}/cancel`` ``cancelled``.
"""
from __future__ import annotations

import time
import uuid

from gh200rt.serve.responses import chat_choice_logprobs, chat_message

DEFAULTS = {"temperature": 1.0, "top_p": 1.0, "parallel_tool_calls": True, "tool_choice": "auto"}


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def _echoed(echo: dict, name: str):
    return echo[name] if echo.get(name) is not None else DEFAULTS[name]


def base_response(response_id: str, model: str, echo: dict, store: bool, status: str = "in_progress",
                  created: int | None = None) -> dict:
    """The response object without output or usage: what every event and the final body repeat."""
    return {"id": response_id, "object": "response", "created_at": created or int(time.time()), "status": status,
            "background": False, "error": None, "incomplete_details": None,
            "instructions": echo.get("instructions"), "max_output_tokens": echo.get("max_output_tokens"),
            "max_tool_calls": None, "model": model, "output": [],
            "parallel_tool_calls": _echoed(echo, "parallel_tool_calls"),
            "previous_response_id": echo.get("previous_response_id"),
            "reasoning": echo.get("reasoning") or {"effort": None, "summary": None},
            "service_tier": "default", "store": store, "temperature": _echoed(echo, "temperature"),
            "text": echo.get("text") or {"format": {"type": "text"}}, "tool_choice": _echoed(echo, "tool_choice"),
            "tools": echo.get("tools") or [], "top_logprobs": echo.get("top_logprobs"),
            "top_p": _echoed(echo, "top_p"), "truncation": "disabled", "usage": None, "user": echo.get("user"),
            "safety_identifier": echo.get("safety_identifier"), "metadata": echo.get("metadata") or {}}


def reasoning_item(text: str, item_id: str | None = None, status: str = "completed") -> dict:
    return {"type": "reasoning", "id": item_id or new_id("rs"), "summary": [],
            "content": [{"type": "reasoning_text", "text": text}], "status": status}


def message_item(text: str, logprobs: list, item_id: str | None = None, status: str = "completed") -> dict:
    return {"type": "message", "id": item_id or new_id("msg"), "status": status, "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs}]}


def function_call_item(call: dict, status: str = "completed") -> dict:
    """A chat tool call (``tool_call_dicts``) as a Responses item."""
    return {"type": "function_call", "id": new_id("fc"), "call_id": new_id("call"),
            "name": call["function"]["name"], "arguments": call["function"]["arguments"], "status": status}


def status_of(finish: str | None, cancelled: bool) -> tuple[str, dict | None]:
    if cancelled:
        return "cancelled", None
    if finish == "length":
        return "incomplete", {"reason": "max_output_tokens"}
    return "completed", None


def finished_output(tok, run, deltas: list, cancelled: bool = False) -> tuple[list[dict], dict, str, dict | None]:
    """(output items, the chat message they came from, status, incomplete details) of a run's one choice."""
    text = "".join(d.text for d in deltas)
    last = next((d for d in reversed(deltas) if d.finish_reason), None)
    message, finish = chat_message(run, text, last.finish_reason if last else None)
    status, incomplete = status_of(finish, cancelled)
    items = []
    if message.get("reasoning_content"):
        items.append(reasoning_item(message["reasoning_content"]))
    logprobs = chat_choice_logprobs(tok, run.parsed, deltas)
    if (message.get("content") or "").strip() or not message.get("tool_calls"):   # text beside the calls
        items.append(message_item(message.get("content") or "", logprobs["content"] if logprobs else [],
                                  status="incomplete" if status != "completed" else "completed"))
    for call in message.get("tool_calls") or []:
        items.append(function_call_item(call))
    return items, message, status, incomplete


def response_usage(tok, run, reasoning: str | None) -> dict:
    """Responses' usage: the prompt's tokens (those the prefix cache supplied), the answer's (its reasoning's)."""
    prompt, output = run.prompt_tokens, run.completion_tokens
    thinking = len(tok.encode(reasoning, add_special_tokens=False)) if reasoning else 0
    return {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": run.num_cached_tokens},
            "output_tokens": output, "output_tokens_details": {"reasoning_tokens": min(thinking, output)},
            "total_tokens": prompt + output}


def answered_turn(items: list[dict]) -> dict:
    """The assistant's chat message for a stored conversation: the output's text, calls and reasoning."""
    turn = {"role": "assistant", "content": ""}
    for item in items:
        if item["type"] == "message":
            turn["content"] = item["content"][0]["text"]
        elif item["type"] == "reasoning":
            turn["reasoning_content"] = item["content"][0]["text"]
        elif item["type"] == "function_call":
            turn.setdefault("tool_calls", []).append(
                {"id": item["call_id"], "type": "function",
                 "function": {"name": item["name"], "arguments": item["arguments"]}})
    return turn
