"""Anthropic's Messages API: ``POST /v1/messages`` and ``POST /v1/messages/count_tokens`` (each also without
``/v1``, as the OpenAI routes answer), so Anthropic's clients and Claude-style coding tools can call the server.

A message is a chat completion underneath (``messages_request`` translates the body): the same template, tools,
reasoning parser, admission (503 with Retry-After when full), engine run and disconnect handling; only the body
(``messages_response``), the stream (``messages_stream``) and the error shape (``messages_errors``) are Anthropic's.
The API key is read from ``x-api-key`` or ``Authorization: Bearer`` (``guard``). ``anthropic-version`` and
``anthropic-beta`` headers are accepted and not read: a beta unlocks body fields, and every body field is checked.
"""
from __future__ import annotations

import asyncio
import uuid

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from gh200rt.serve.generation_routes import chat_render, start_run, while_connected
from gh200rt.serve.guard import ClosingStreamingResponse, DisconnectAwareResponse
from gh200rt.serve.messages_request import parse_messages_request
from gh200rt.serve.messages_response import message_body
from gh200rt.serve.messages_stream import stream_message


def add_messages_routes(app: FastAPI, state) -> None:
    def parse(body: dict, count_only: bool):
        config = state.config
        return parse_messages_request(body, config.tool_call_parser, config.enable_auto_tool_choice,
                                      state.max_logprobs, config.reasoning_parser, count_only)

    async def create(body: dict):
        parsed, messages = parse(body, count_only=False)
        model = state.check_model(parsed.model)
        run = await start_run(state, parsed, model, "msg", chat_render(state, parsed, messages))
        message_id = f"msg_{uuid.uuid4().hex}"
        if parsed.stream:
            return ClosingStreamingResponse(stream_message(run, message_id, model), run.close,
                                            media_type="text/event-stream",
                                            headers={"cache-control": "no-cache", "x-accel-buffering": "no"})

        async def produce() -> JSONResponse:
            per_choice = await run.collect()
            return JSONResponse(message_body(run, message_id, model, per_choice.get(0, [])))
        return DisconnectAwareResponse(produce, run.close)

    async def count_tokens(body: dict):
        parsed, messages = parse(body, count_only=True)
        state.check_model(parsed.model)
        ids = await asyncio.to_thread(chat_render(state, parsed, messages))
        return JSONResponse({"input_tokens": len(ids)})

    @app.post("/v1/messages")
    @app.post("/messages")
    async def messages(request: Request):
        return await while_connected(request, create(await state.read_json(request)))

    @app.post("/v1/messages/count_tokens")
    @app.post("/messages/count_tokens")
    async def messages_count_tokens(request: Request):
        return await while_connected(request, count_tokens(await state.read_json(request)))
