"""Anthropic's message body, and the pieces the stream shares with it: content blocks, ``stop_reason`` and ``usage``.

An answer becomes blocks in the order it was written: ``thinking`` (what the --reasoning-parser split off), ``text``,
then one ``tool_use`` per call the tool choice produced (read out of the text by the --tool-call-parser for ``auto``,
grammar-constrained for ``any`` / ``tool``). Streamed or not, the same readers (``ReasoningStream``, ``ToolStream``)
cut the answer, so both give the same blocks.

A thinking block's ``signature`` is empty: Anthropic's signs its thinking so it can check a block passed back; this
server keeps nothing to check against and reads a passed-back block as text, whatever its signature.
A call whose arguments are not a JSON object cannot be a ``tool_use`` (its ``input`` is an object): the answer then
stays text, with ``end_turn``.
"""
from __future__ import annotations

import json
import uuid

from gh200rt.serve.reasoning import ReasoningStream
from gh200rt.serve.tool_stream import ToolStream

SIGNATURE = ""


def thinking_block(text: str) -> dict:
    return {"type": "thinking", "thinking": text, "signature": SIGNATURE}


def text_block(text: str) -> dict:
    return {"type": "text", "text": text}


def tool_use_block(name: str, arguments: dict) -> dict:
    return {"type": "tool_use", "id": f"toolu_{uuid.uuid4().hex}", "name": name, "input": arguments}


def _object(arguments: str) -> dict | None:
    try:
        value = json.loads(arguments)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def tool_stream(run) -> ToolStream | None:
    """The reader that holds back possible tool calls, where the request's tool choice can produce some."""
    tools = run.parsed.extra.get("tools")
    return ToolStream(tools) if tools is not None and tools.parses_output else None


def reasoning_stream(run) -> ReasoningStream | None:
    parser = run.parsed.extra.get("reasoning")
    return ReasoningStream(parser) if parser is not None else None


def finish_tools(calls: ToolStream, finish: str | None) -> tuple[str, list[dict], str | None]:
    """Once the answer ended: (the text held back that is not a call, the tool_use blocks, the finish reason)."""
    rest = calls.text[calls.sent:]
    delta, finish = calls.finish(finish)
    found = delta.get("tool_calls") or []
    inputs = [_object(call["function"]["arguments"]) for call in found]
    if not found or None in inputs:
        return rest, [], "stop" if found else finish
    return "", [tool_use_block(call["function"]["name"], i) for call, i in zip(found, inputs)], finish


def stop_reason(finish: str | None, stop, output_tokens: int, max_tokens: int | None) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence): the matched stop string is a ``stop_sequence``; a length stop short of
    ``max_tokens`` ran out of the model's context (max_model_len)."""
    if finish == "tool_calls":
        return "tool_use", None
    if finish == "length":
        full = max_tokens is None or output_tokens >= max_tokens
        return ("max_tokens" if full else "model_context_window_exceeded"), None
    if isinstance(stop, str):
        return "stop_sequence", stop
    return "end_turn", None


def usage(run) -> dict:
    """Anthropic's input counts add up to the prompt: ``cache_read_input_tokens`` the prefix cache supplied,
    ``input_tokens`` the rest; nothing is billed for writing the cache, which every prompt fills."""
    cached = run.num_cached_tokens
    return {"input_tokens": run.prompt_tokens - cached, "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": cached, "output_tokens": run.completion_tokens}


def envelope(message_id: str, model: str, content: list[dict], reason: str | None, sequence: str | None,
             counts: dict) -> dict:
    return {"id": message_id, "type": "message", "role": "assistant", "model": model, "content": content,
            "stop_reason": reason, "stop_sequence": sequence, "usage": counts}


def message_body(run, message_id: str, model: str, deltas: list) -> dict:
    """The non-streamed body of a finished run (one choice: Anthropic has no ``n``)."""
    last = next((d for d in reversed(deltas) if d.finish_reason), None)
    finish, stop = (last.finish_reason, last.stop_reason) if last else (None, None)
    text = "".join(d.text for d in deltas)
    thoughts, calls = reasoning_stream(run), tool_stream(run)
    reasoning, content = thoughts.feed(text) if thoughts else ("", text)
    if thoughts:
        more_reasoning, more_content = thoughts.finish()
        reasoning, content = reasoning + more_reasoning, content + more_content
    uses = []
    if calls is not None:
        sent = calls.feed(content)
        rest, uses, finish = finish_tools(calls, finish)
        content = sent + rest
    blocks = ([thinking_block(reasoning)] if reasoning else []) + ([text_block(content)] if content else []) + uses
    reason, sequence = stop_reason(finish, stop, run.completion_tokens, run.parsed.params.max_tokens)
    return envelope(message_id, model, blocks, reason, sequence, usage(run))
