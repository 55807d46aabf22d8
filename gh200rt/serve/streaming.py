"""SSE bodies for streamed completions and chat: one choice per chunk (as OpenAI and vLLM send, so
clients that read ``choices[0]`` miss nothing), role only in each choice's first chat delta,
exactly one finish_reason per choice, a usage chunk only when asked (and then ``"usage": null``
on every other chunk, as OpenAI documents, or the running usage with ``continuous_usage_stats``),
``[DONE]`` last.

The generator's ``finally`` closes the run: a client that disconnects cancels the generator
(Starlette), which aborts the engine requests and frees their KV blocks at once.
"""
from __future__ import annotations

import logging
import time

from gh200rt.serve.errors import APIError, error_body
from gh200rt.serve.generation import GenerationRun
from gh200rt.serve.reasoning import ReasoningStream, reasoning_fields
from gh200rt.serve.responses import (chat_choice_logprobs, completion_logprobs, echo_text, envelope, generated_pairs,
                                     logprob_names, prompt_logprobs_body, prompt_pairs, usage)
from gh200rt.serve.sse import DONE, sse_event
from gh200rt.serve.tool_stream import ToolStream

log = logging.getLogger("gh200rt.serve")


async def _guarded(run: GenerationRun, chunks):
    try:
        async for item in chunks:
            yield item
        if run.parsed.include_usage:
            body = run.chunk_envelope([])
            body["usage"] = usage(run)
            yield sse_event(body)
    except APIError as e:
        yield sse_event(e.body())
    except Exception as e:                  # after the 200 header, errors travel in-band
        log.exception("stream failed")
        yield sse_event(error_body(500, f"internal error: {type(e).__name__}"))
    finally:
        run.close()
    yield DONE


def _set_envelope(run: GenerationRun, request_id: str, obj: str, model: str) -> None:
    created = int(time.time())
    continuous = run.parsed.include_usage and run.parsed.continuous_usage

    def chunk_envelope(choices: list) -> dict:
        body = envelope(request_id, obj, model, choices, created)
        if run.parsed.include_usage:
            body["usage"] = usage(run) if continuous and choices else None
        return body
    run.chunk_envelope = chunk_envelope


def stream_completion(run: GenerationRun, request_id: str, model: str, tok):
    _set_envelope(run, request_id, "text_completion", model)
    parsed = run.parsed
    n = parsed.params.n

    async def chunks():
        offsets: dict[int, int] = {}
        async for batch in run.deltas():
            for d in batch:
                first = d.index not in offsets
                text = (echo_text(tok, run, d.index // n) if first and parsed.echo else "") + d.text
                lp = None
                if parsed.logprobs is not None:
                    pairs = (prompt_pairs(run, d.index // n) if first and parsed.echo else []) + generated_pairs([d])
                    lp = completion_logprobs(logprob_names(tok, parsed), pairs, offsets.get(d.index, 0))
                offsets[d.index] = offsets.get(d.index, 0) + len(text)
                ids = parsed.return_token_ids
                choice = {"index": d.index, "text": text, "logprobs": lp, "finish_reason": d.finish_reason,
                          "stop_reason": d.stop_reason, "token_ids": d.token_ids if ids else None,
                          "prompt_token_ids": run.prompt_token_ids.get(d.index // n) if ids and first else None}
                if first and parsed.prompt_logprobs is not None:
                    choice["prompt_logprobs"] = prompt_logprobs_body(tok, run.prompt_logprobs.get(d.index // n))
                yield sse_event(run.chunk_envelope([choice]))

    return _guarded(run, chunks())


def stream_chat(run: GenerationRun, request_id: str, model: str, tok):
    _set_envelope(run, request_id, "chat.completion.chunk", model)
    parsed = run.parsed
    tools = parsed.extra.get("tools")

    def chunk(index: int, delta: dict, lp=None, finish=None, token_ids=None) -> str:
        choice = {"index": index, "delta": delta, "logprobs": lp, "finish_reason": finish}
        if token_ids is not None:
            choice["token_ids"] = token_ids
        return sse_event(run.chunk_envelope([choice]))

    async def chunks():
        count = parsed.params.n * len(parsed.prompts)
        streams = {i: ToolStream(tools) for i in range(count)} if tools is not None and tools.parses_output else {}
        parser = parsed.extra.get("reasoning")
        thoughts = {i: ReasoningStream(parser) for i in range(count)} if parser is not None else {}

        def answer(index: int, reasoning: str, content: str) -> tuple[dict, bool]:
            """A delta of reasoning and content (tool calls held back from the content), and whether it has text."""
            if index in streams:
                content = streams[index].feed(content)
            delta = reasoning_fields(reasoning) if reasoning and parsed.extra.get("include_reasoning", True) else {}
            if content or not delta:
                delta["content"] = content
            return delta, bool(content or len(delta) > 1)
        for i in range(count):
            if i == 0 and parsed.return_token_ids:       # vLLM: the prompt's ids ride on the first chunk
                body = run.chunk_envelope([{"index": 0, "delta": {"role": "assistant", "content": ""},
                                            "logprobs": None, "finish_reason": None}])
                yield sse_event({**body, "prompt_token_ids": parsed.prompts[0][1]})
            else:
                yield chunk(i, {"role": "assistant", "content": ""})
            if parsed.echo and parsed.extra["echo_text"]:
                yield chunk(i, {"content": parsed.extra["echo_text"]})
        async for batch in run.deltas():
            for d in batch:
                lp = chat_choice_logprobs(tok, parsed, [d])
                ids = d.token_ids if parsed.return_token_ids else None
                finish = d.finish_reason
                reasoning, content = thoughts[d.index].feed(d.text) if d.index in thoughts else ("", d.text)
                delta, has_text = answer(d.index, reasoning, content)
                if has_text or lp or ids:
                    yield chunk(d.index, delta, lp, None, ids)
                if finish:
                    if d.index in thoughts:          # text held back as a possible tag
                        delta, has_text = answer(d.index, *thoughts[d.index].finish())
                        if has_text:
                            yield chunk(d.index, delta)
                    delta, finish = streams[d.index].finish(finish) if d.index in streams else ({}, finish)
                    yield chunk(d.index, delta, None, finish)

    return _guarded(run, chunks())
