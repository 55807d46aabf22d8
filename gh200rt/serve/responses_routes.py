"""OpenAI's Responses API: ``POST /v1/responses`` (plain and streamed), ``GET`` / ``DELETE /v1/responses/{id}``,
``POST /v1/responses/{id}/cancel`` and ``GET /v1/responses/{id}/input_items``.

A request is read as the chat completion it asks for (``responses_request.py``), runs through the chat route's
admission, template and engine run (``generation_routes.start_run``), and answers as a response object
(``responses_output.py``) or its event stream (``responses_stream.py``); stored responses and the ones being
generated live in ``state.responses`` (``responses_store.py``). Errors keep the OpenAI error body of the other routes.
"""
from __future__ import annotations

import asyncio

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from gh200rt.serve.chat_request import parse_chat_request
from gh200rt.serve.errors import APIError, bad_request
from gh200rt.serve.generation_routes import chat_render, start_run, while_connected
from gh200rt.serve.guard import ClosingStreamingResponse, DisconnectAwareResponse
from gh200rt.serve.responses_output import answered_turn, base_response, finished_output, new_id, response_usage
from gh200rt.serve.responses_request import parse_responses_request
from gh200rt.serve.responses_store import InFlight, StoredResponse
from gh200rt.serve.responses_stream import stream_response

CANCEL_WAIT_S = 5.0         # how long a cancel waits for the response it stopped to settle


async def until_cancelled(batches, cancelled: asyncio.Event):
    """``batches`` until they end or ``cancelled`` is set (then the run is closed by its owner)."""
    source = batches.__aiter__()
    while not cancelled.is_set():
        step, stop = asyncio.ensure_future(source.__anext__()), asyncio.ensure_future(cancelled.wait())
        try:
            done, _ = await asyncio.wait({step, stop}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
            if not step.done():
                step.cancel()
        if step not in done:
            return
        try:
            batch = step.result()
        except StopAsyncIteration:
            return
        yield batch


def listed_item(item: dict) -> dict:
    """An input item as ``input_items`` lists it: with an id (``msg_...`` where the client gave none), and a message
    in its long form (a type, content as parts)."""
    item = {"id": new_id("msg"), **item}
    if item.get("type", "message") == "message":
        content = item.get("content")
        kind = "output_text" if item.get("role") == "assistant" else "input_text"
        item = {**item, "type": "message", "status": "completed",
                "content": [{"type": kind, "text": content}] if isinstance(content, str) else content}
    return item


def add_responses_routes(app: FastAPI, state) -> None:
    async def create(body: dict):
        store = state.responses
        request = parse_responses_request(body, store.history(body.get("previous_response_id")))
        parsed, messages = parse_chat_request(request.chat, state.config.tool_call_parser,
                                              state.config.enable_auto_tool_choice, state.max_logprobs,
                                              state.config.reasoning_parser)
        model = state.check_model(parsed.model)
        tok = state.ready_engine().tokenizer
        run = await start_run(state, parsed, model, "resp", chat_render(state, parsed, messages))
        response_id = new_id("resp")
        base = base_response(response_id, model, request.echo, request.store)
        flight = store.in_flight[response_id] = InFlight(base)

        def finished(items: list[dict], status: str, incomplete: dict | None, reasoning: str | None) -> dict:
            final = {**base, "status": status, "incomplete_details": incomplete, "output": items,
                     "usage": response_usage(tok, run, reasoning)}
            store.in_flight.pop(response_id, None)
            if request.store:
                store.keep(response_id, StoredResponse(final, request.conversation + [answered_turn(items)],
                                                       [listed_item(item) for item in request.input_items]))
            return final

        def close() -> None:
            run.close()
            store.in_flight.pop(response_id, None)

        batches = until_cancelled(run.deltas(), flight.cancelled)
        if request.stream:
            events = stream_response(run, tok, base, batches, flight.cancelled.is_set, finished)
            return ClosingStreamingResponse(events, close, media_type="text/event-stream",
                                            headers={"cache-control": "no-cache", "x-accel-buffering": "no"})

        async def produce() -> JSONResponse:
            deltas = []
            try:
                async for batch in batches:
                    deltas += batch
            finally:
                run.close()
            items, message, status, incomplete = finished_output(tok, run, deltas, flight.cancelled.is_set())
            return JSONResponse(finished(items, status, incomplete, message.get("reasoning_content")))
        return DisconnectAwareResponse(produce, close)

    @app.post("/v1/responses")
    @app.post("/responses")
    async def responses(request: Request):
        return await while_connected(request, create(await state.read_json(request)))

    @app.get("/v1/responses/{response_id}")
    @app.get("/responses/{response_id}")
    async def get_response(response_id: str):
        return JSONResponse(state.responses.body(response_id))

    @app.delete("/v1/responses/{response_id}")
    @app.delete("/responses/{response_id}")
    async def delete_response(response_id: str):
        state.responses.delete(response_id)
        return JSONResponse({"id": response_id, "object": "response", "deleted": True})

    @app.post("/v1/responses/{response_id}/cancel")
    @app.post("/responses/{response_id}/cancel")
    async def cancel_response(response_id: str):
        store = state.responses
        flight = store.in_flight.get(response_id)
        store.cancel(response_id)                      # a 400 unless it is being generated
        for _ in range(int(CANCEL_WAIT_S / 0.01)):     # the generating request settles it (and stores it)
            if response_id not in store.in_flight:
                break
            await asyncio.sleep(0.01)
        try:
            return JSONResponse(store.body(response_id))
        except APIError:                               # made with store false: not kept, but cancelled
            return JSONResponse({**flight.body, "status": "cancelled"})

    @app.get("/v1/responses/{response_id}/input_items")
    @app.get("/responses/{response_id}/input_items")
    async def input_items(response_id: str, limit: int = 20, order: str = "desc", after: str | None = None):
        if not 1 <= limit <= 100:
            raise bad_request(f"'limit' must be between 1 and 100, got {limit}", "limit")
        if order not in ("asc", "desc"):
            raise bad_request(f"'order' must be asc or desc, got {order!r}", "order")
        items = state.responses.get(response_id).input_items
        items = items if order == "asc" else items[::-1]
        if after is not None:
            ids = [item.get("id") for item in items]
            if after not in ids:
                raise bad_request(f"'after' {after!r} is not an input item of response {response_id!r}", "after")
            items = items[ids.index(after) + 1:]
        page = items[:limit]
        return JSONResponse({"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
                             "last_id": page[-1]["id"] if page else None, "has_more": len(items) > limit})
