"""SSE bodies for streamed completions and chat: role only in each choice's first chat delta,
exactly one finish_reason per choice, a usage chunk only when asked, ``[DONE]`` last.

The generator's ``finally`` closes the run: a client that disconnects cancels the generator
(Starlette), which aborts the engine requests and frees their KV blocks at once.
"""
from __future__ import annotations

import logging
import time

from gh200rt.serve.errors import APIError, error_body
from gh200rt.serve.generation import GenerationRun
from gh200rt.serve.responses import chat_logprobs, completion_logprobs, envelope, usage
from gh200rt.serve.sse import DONE, sse_event

log = logging.getLogger("gh200rt.serve")


async def _guarded(run: GenerationRun, chunks):
    try:
        async for item in chunks:
            yield item
        if run.parsed.include_usage:
            yield sse_event(_usage_chunk(run))
    except APIError as e:
        yield sse_event(e.body())
    except Exception as e:                  # after the 200 header, errors travel in-band
        log.exception("stream failed")
        yield sse_event(error_body(500, f"internal error: {e}"))
    finally:
        run.close()
    yield DONE


def _usage_chunk(run: GenerationRun) -> dict:
    body = run.chunk_envelope([])
    body["usage"] = usage(run.prompt_tokens, run.completion_tokens)
    return body


def stream_completion(run: GenerationRun, request_id: str, model: str, tok):
    created = int(time.time())
    run.chunk_envelope = lambda choices: envelope(request_id, "text_completion", model, choices, created)
    n = run.parsed.params.n

    async def chunks():
        offsets: dict[int, int] = {}
        async for batch in run.deltas():
            choices = []
            for d in batch:
                text = d.text
                if d.index not in offsets and run.parsed.echo:
                    text, ids = run.parsed.prompts[d.index // n]
                    text = (text if text is not None else tok.decode(ids, skip_special_tokens=False)) + d.text
                offset = offsets.get(d.index, 0)
                lp = completion_logprobs(tok, [d], offset) if run.parsed.logprobs is not None else None
                offsets[d.index] = offset + len(text)
                choices.append({"index": d.index, "text": text, "logprobs": lp, "finish_reason": d.finish_reason,
                                "stop_reason": d.stop_reason})
            yield sse_event(run.chunk_envelope(choices))

    return _guarded(run, chunks())


def stream_chat(run: GenerationRun, request_id: str, model: str, tok):
    created = int(time.time())
    run.chunk_envelope = lambda choices: envelope(request_id, "chat.completion.chunk", model, choices, created)

    async def chunks():
        n = run.parsed.params.n
        yield sse_event(run.chunk_envelope([{"index": i, "delta": {"role": "assistant", "content": ""},
                                             "logprobs": None, "finish_reason": None} for i in range(n)]))
        async for batch in run.deltas():
            choices = []
            for d in batch:
                lp = chat_logprobs(tok, [d], run.parsed.logprobs) if run.parsed.logprobs is not None else None
                delta = {"content": d.text} if d.text or not d.finish_reason else {}
                choices.append({"index": d.index, "delta": delta, "logprobs": lp, "finish_reason": d.finish_reason})
            yield sse_event(run.chunk_envelope(choices))

    return _guarded(run, chunks())
