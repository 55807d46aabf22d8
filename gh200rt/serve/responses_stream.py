"""A streamed /v1/responses answer: OpenAI's Responses event sequence over a chat run's deltas.

``response.created`` and ``response.in_progress`` first; then per output item, in order: ``output_item.added``,
``content_part.added``, its deltas (``reasoning_text.delta`` for what --reasoning-parser splits off,
``output_text.delta`` with the token logprobs ``include`` asked for), the ``.done`` of each, ``output_item.done``;
tool calls, read once the answer finished (a tool call's text is held back as the chat stream holds it), as
``function_call`` items with their arguments in one ``function_call_arguments.delta``; last ``response.completed``
(``response.incomplete`` when cut by ``max_output_tokens``, or cancelled: its status says which). Every event carries
its ``sequence_number`` and an SSE ``event:`` line; an error after the first byte is an ``error`` event.
"""
from __future__ import annotations

import logging

from gh200rt.serve.errors import APIError
from gh200rt.serve.reasoning import ReasoningStream
from gh200rt.serve.responses import chat_choice_logprobs
from gh200rt.serve.responses_output import function_call_item, message_item, reasoning_item, status_of
from gh200rt.serve.sse import sse_event
from gh200rt.serve.tool_stream import ToolStream

log = logging.getLogger("gh200rt.serve")


class Events:
    """Numbered SSE events."""

    def __init__(self):
        self.sequence = 0

    def __call__(self, kind: str, **fields) -> bytes:
        payload = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return f"event: {kind}\n".encode() + sse_event(payload)


class OutputItems:
    """The items of one answer as they grow: at most one reasoning or message item open at a time."""

    def __init__(self, event: Events):
        self.event = event
        self.items: list[dict] = []
        self.open: dict | None = None
        self.text = ""
        self.logprobs: list = []
        self.held, self.held_logprobs = "", []    # spaces before a message is opened

    def _start(self, item: dict, part: dict) -> list[bytes]:
        out = self.close()
        self.items.append(item)
        self.open, self.text, self.logprobs = item, "", []
        index = len(self.items) - 1
        return out + [self.event("response.output_item.added", output_index=index, item=item),
                      self.event("response.content_part.added", item_id=item["id"], output_index=index,
                                 content_index=0, part=part)]

    def reasoning(self, delta: str) -> list[bytes]:
        out = []
        if self.open is None or self.open["type"] != "reasoning":
            out = self._start({**reasoning_item("", status="in_progress"), "content": []},
                              {"type": "reasoning_text", "text": ""})
        self.text += delta
        return out + [self.event("response.reasoning_text.delta", item_id=self.open["id"],
                                 output_index=len(self.items) - 1, content_index=0, delta=delta)]

    def message(self, delta: str, logprobs: list, hold_space: bool = False) -> list[bytes]:
        """``hold_space``: text of spaces alone opens no message yet (a tool call may follow: a message item only
        where the answer says something beside it, as the plain response has)."""
        if self.open is None or self.open["type"] != "message":
            if hold_space and not (self.held + delta).strip():
                self.held += delta
                self.held_logprobs += logprobs
                return []
            delta, logprobs = self.held + delta, self.held_logprobs + logprobs
            self.held, self.held_logprobs = "", []
        out = []
        if self.open is None or self.open["type"] != "message":
            out = self._start({**message_item("", [], status="in_progress"), "content": []},
                              {"type": "output_text", "text": "", "annotations": [], "logprobs": []})
        self.text += delta
        self.logprobs += logprobs
        return out + [self.event("response.output_text.delta", item_id=self.open["id"],
                                 output_index=len(self.items) - 1, content_index=0, delta=delta, logprobs=logprobs)]

    def close(self, status: str = "completed") -> list[bytes]:
        """End the open item (``status``: its status, for a message cut short)."""
        item, self.open = self.open, None
        if item is None:
            return []
        index, ids = len(self.items) - 1, dict(item_id=item["id"], output_index=len(self.items) - 1, content_index=0)
        if item["type"] == "reasoning":
            done = reasoning_item(self.text, item["id"])
            events = [self.event("response.reasoning_text.done", **ids, text=self.text)]
        else:
            done = message_item(self.text, self.logprobs, item["id"], status)
            events = [self.event("response.output_text.done", **ids, text=self.text, logprobs=self.logprobs)]
        self.items[index] = done
        return events + [self.event("response.content_part.done", **ids, part=done["content"][0]),
                         self.event("response.output_item.done", output_index=index, item=done)]

    def function_calls(self, calls: list[dict]) -> list[bytes]:
        out = self.close()
        for call in calls:
            item = function_call_item(call)
            self.items.append(item)
            index = len(self.items) - 1
            ids = dict(item_id=item["id"], output_index=index)
            out += [self.event("response.output_item.added", output_index=index,
                               item={**item, "arguments": "", "status": "in_progress"}),
                    self.event("response.function_call_arguments.delta", **ids, delta=item["arguments"]),
                    self.event("response.function_call_arguments.done", **ids, name=item["name"],
                               arguments=item["arguments"]),
                    self.event("response.output_item.done", output_index=index, item=item)]
        return out


async def stream_response(run, tok, base: dict, deltas, was_cancelled, finished):
    """The event stream of ``run``'s one choice; ``deltas``: its delta batches (cut short on cancel, which
    ``was_cancelled()`` tells); ``finished(items, status, incomplete, reasoning)``: the final response object."""
    event = Events()
    parsed = run.parsed
    tools = parsed.extra.get("tools")
    calls_from = ToolStream(tools) if tools is not None and tools.parses_output else None
    parser = parsed.extra.get("reasoning")
    thoughts = ReasoningStream(parser) if parser is not None else None
    output = OutputItems(event)
    reasoning_text, finish, held_logprobs = "", None, []
    yield event("response.created", response=base)
    yield event("response.in_progress", response=base)
    try:
        async for batch in deltas:
            for d in batch:
                reasoning, content = thoughts.feed(d.text) if thoughts is not None else ("", d.text)
                if d.finish_reason and thoughts is not None:
                    more_reasoning, more = thoughts.finish()
                    reasoning, content = reasoning + more_reasoning, content + more
                if reasoning:
                    reasoning_text += reasoning
                    for chunk in output.reasoning(reasoning):
                        yield chunk
                shown = calls_from.feed(content) if calls_from is not None else content
                logprobs = chat_choice_logprobs(tok, parsed, [d])
                held_logprobs += logprobs["content"] if logprobs else []
                if shown:               # a token's logprobs ride with the first text after it
                    for chunk in output.message(shown, held_logprobs, hold_space=calls_from is not None):
                        yield chunk
                    held_logprobs = []
                if d.finish_reason:
                    finish = d.finish_reason
        cancelled = was_cancelled()
        calls = []
        if calls_from is not None and not cancelled:
            delta, finish = calls_from.finish(finish)
            calls = delta.get("tool_calls") or []
            rest = delta.get("content") or ""
            if rest or (output.held and not calls):          # spaces alone are an answer when nothing else is
                for chunk in output.message(rest, held_logprobs, hold_space=bool(calls)):
                    yield chunk
        status, incomplete = status_of(finish, cancelled)
        for chunk in output.close("completed" if status == "completed" else "incomplete"):
            yield chunk
        for chunk in output.function_calls(calls):
            yield chunk
        final = finished(output.items, status, incomplete, reasoning_text or None)
        kind = "response.completed" if status == "completed" else "response.incomplete"
        yield event(kind, response=final)
    except APIError as e:
        yield event("error", code=e.code or str(e.status), message=e.message, param=e.param)
    except Exception as e:                  # after the 200 header, errors travel in-band
        log.exception("responses stream failed")
        yield event("error", code="internal_error", message=f"internal error: {type(e).__name__}", param=None)
    finally:
        run.close()
