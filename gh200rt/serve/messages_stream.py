"""A streamed message as Anthropic sends it: ``event:`` lines naming each event, ``message_start`` (usage with the
prompt's tokens) and a ``ping``, then per content block ``content_block_start``, its deltas (``thinking_delta``,
``text_delta``, ``input_json_delta``) and ``content_block_stop``, one block open at a time; then ``message_delta``
(stop_reason, stop_sequence, the final usage) and ``message_stop``. No ``[DONE]``.

Text goes out as generated; text that may be a tool call is held back (``ToolStream``) and sent, once the answer
ended, as ``tool_use`` blocks whose input arrives in one ``input_json_delta``. An error once the 200 is sent is an
``error`` event. The generator's ``finally`` closes the run, as the OpenAI streams do.
"""
from __future__ import annotations

import json
import logging

from gh200rt.serve.errors import APIError
from gh200rt.serve.messages_errors import anthropic_error_body
from gh200rt.serve.messages_response import (SIGNATURE, envelope, finish_tools, reasoning_stream, stop_reason,
                                             tool_stream, usage)
from gh200rt.serve.sse import sse_event

log = logging.getLogger("gh200rt.serve")
_START = {"thinking": {"type": "thinking", "thinking": "", "signature": ""}, "text": {"type": "text", "text": ""}}


def event(payload: dict) -> bytes:
    return f"event: {payload['type']}\n".encode() + sse_event(payload)


class BlockEvents:
    """The events of one message's content blocks: indices in order, at most one block open."""

    def __init__(self):
        self.index = -1
        self.open: str | None = None

    def start(self, block: dict) -> list[bytes]:
        events = self.stop()
        self.index += 1
        self.open = block["type"]
        return events + [event({"type": "content_block_start", "index": self.index, "content_block": block})]

    def stop(self) -> list[bytes]:
        if self.open is None:
            return []
        events = []
        if self.open == "thinking":
            events.append(self.delta({"type": "signature_delta", "signature": SIGNATURE}))
        self.open = None
        return events + [event({"type": "content_block_stop", "index": self.index})]

    def delta(self, delta: dict) -> bytes:
        return event({"type": "content_block_delta", "index": self.index, "delta": delta})

    def text(self, kind: str, text: str) -> list[bytes]:
        """``text`` appended to a thinking or text block (one is started unless it is the open one)."""
        if not text:
            return []
        events = self.start(dict(_START[kind])) if self.open != kind else []
        delta = {"type": "thinking_delta", "thinking": text} if kind == "thinking" else {"type": "text_delta",
                                                                                        "text": text}
        return events + [self.delta(delta)]

    def answer(self, reasoning: str, content: str) -> list[bytes]:
        return self.text("thinking", reasoning) + self.text("text", content)

    def tool_use(self, block: dict) -> list[bytes]:
        arguments = json.dumps(block["input"], ensure_ascii=False)
        events = self.start({**block, "input": {}})
        return events + [self.delta({"type": "input_json_delta", "partial_json": arguments})] + self.stop()


async def stream_message(run, message_id: str, model: str):
    parsed = run.parsed
    blocks = BlockEvents()
    try:
        # the prefix cache's share is known once the prompt ran: message_delta's usage splits it off
        start = {"input_tokens": len(parsed.prompts[0][1]), "cache_creation_input_tokens": 0,
                 "cache_read_input_tokens": 0, "output_tokens": 0}
        yield event({"type": "message_start", "message": envelope(message_id, model, [], None, None, start)})
        yield event({"type": "ping"})
        thoughts, calls = reasoning_stream(run), tool_stream(run)
        finish = stop = None
        async for batch in run.deltas():
            for d in batch:
                reasoning, content = thoughts.feed(d.text) if thoughts else ("", d.text)
                for chunk in blocks.answer(reasoning, calls.feed(content) if calls else content):
                    yield chunk
                if d.finish_reason:
                    finish, stop = d.finish_reason, d.stop_reason
        if thoughts:
            reasoning, content = thoughts.finish()
            for chunk in blocks.answer(reasoning, calls.feed(content) if calls else content):
                yield chunk
        if calls:
            rest, uses, finish = finish_tools(calls, finish)
            for chunk in blocks.text("text", rest) + [c for block in uses for c in blocks.tool_use(block)]:
                yield chunk
        for chunk in blocks.stop():
            yield chunk
        reason, sequence = stop_reason(finish, stop, run.completion_tokens, parsed.params.max_tokens)
        yield event({"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": sequence},
                     "usage": usage(run)})
        yield event({"type": "message_stop"})
    except APIError as e:
        yield event(anthropic_error_body(e.status, e.message))
    except Exception as e:                  # after the 200 header, errors travel in-band
        log.exception("stream failed")
        yield event(anthropic_error_body(500, f"internal error: {type(e).__name__}"))
    finally:
        run.close()
