"""SSE bodies for streamed completions and chat: one choice per chunk (as OpenAI and vLLM send, so
clients that read ``choices[0]`` miss nothing), role only in each choice's first chat delta,
exactly one finish_reason per choice, a usage chunk only when asked (and then ``"usage": null``
on every other chunk, as OpenAI documents), ``[DONE]`` last.

The generator's ``finally`` closes the run: a client that disconnects cancels the generator
(Starlette), which aborts the engine requests and frees their KV blocks at once.
"""
from __future__ import annotations

import logging
import time

from gh200rt.serve.errors import APIError, error_body
from gh200rt.serve.generation import GenerationRun
from gh200rt.serve.responses import (chat_logprobs, completion_logprobs, echo_text, envelope, generated_pairs,
                                     prompt_pairs, usage)
from gh200rt.serve.sse import DONE, sse_event

log = logging.getLogger("gh200rt.serve")


async def _guarded(run: GenerationRun, chunks):
    try:
        async for item in chunks:
            yield item
        if run.parsed.include_usage:
            body = run.chunk_envelope([])
            body["usage"] = usage(run.prompt_tokens, run.completion_tokens)
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

    def chunk_envelope(choices: list) -> dict:
        body = envelope(request_id, obj, model, choices, created)
        if run.parsed.include_usage:
            body["usage"] = None
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
                    lp = completion_logprobs(tok, pairs, offsets.get(d.index, 0))
                offsets[d.index] = offsets.get(d.index, 0) + len(text)
                yield sse_event(run.chunk_envelope([{"index": d.index, "text": text, "logprobs": lp,
                                                     "finish_reason": d.finish_reason, "stop_reason": d.stop_reason}]))

    return _guarded(run, chunks())


def stream_chat(run: GenerationRun, request_id: str, model: str, tok):
    _set_envelope(run, request_id, "chat.completion.chunk", model)

    async def chunks():
        n = run.parsed.params.n
        for i in range(n * len(run.parsed.prompts)):
            yield sse_event(run.chunk_envelope([{"index": i, "delta": {"role": "assistant", "content": ""},
                                                 "logprobs": None, "finish_reason": None}]))
        async for batch in run.deltas():
            for d in batch:
                lp = chat_logprobs(tok, [d], run.parsed.logprobs) if run.parsed.logprobs is not None else None
                delta = {"content": d.text} if d.text or not d.finish_reason else {}
                yield sse_event(run.chunk_envelope([{"index": d.index, "delta": delta, "logprobs": lp,
                                                     "finish_reason": d.finish_reason}]))

    return _guarded(run, chunks())
