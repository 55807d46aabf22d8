"""Pure-ASGI middleware for the cross-cutting rules: CORS (preflight answered without a key),
the API key on every route but /health, 413 for oversized bodies, 415 for bodies that say they are
not JSON, 503 once shutdown began.

Pure ASGI on purpose: Starlette's BaseHTTPMiddleware hides client disconnects from handlers,
and disconnect detection is what frees a vanished client's KV blocks.
"""
from __future__ import annotations

import asyncio
import hmac
import json

from starlette.responses import Response, StreamingResponse

from gh200rt.serve.errors import APIError
from gh200rt.serve.messages_errors import error_body_for


BASE_ALLOWED_HEADERS = "authorization, content-type, x-api-key"


def cors_headers(origins: tuple[str, ...], origin: str | None, requested_headers: str | None) -> dict[str, str]:
    """Browsers (the OpenAI JS SDK sends ``x-stainless-*``) get whatever headers they ask for, as in
    vLLM and llama.cpp, but only from an allowed origin."""
    if origin is None or not origins or ("*" not in origins and origin not in origins):
        return {}
    allowed = BASE_ALLOWED_HEADERS + (f", {requested_headers}" if requested_headers else "")
    return {"access-control-allow-origin": "*" if "*" in origins else origin, "vary": "Origin",
            "access-control-allow-methods": "GET, POST, OPTIONS",
            "access-control-allow-headers": allowed,
            "access-control-max-age": "600"}


def is_json_media_type(content_type: str | None) -> bool:
    """A missing Content-Type is taken as JSON (curl -d without -H is common); a stated one must be JSON."""
    if not content_type:
        return True
    media = content_type.split(";")[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


def _generates(path: str) -> bool:
    """The routes that start generation: the OpenAI and Anthropic ones with or without /v1, and SageMaker's."""
    return path.startswith("/v1/") or path in ("/completions", "/chat/completions", "/invocations", "/messages")


class Guard:
    def __init__(self, app, state):
        self.app = app
        self.state = state

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        config = self.state.config
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        cors = cors_headers(config.origins, headers.get("origin"), headers.get("access-control-request-headers"))
        path, method = scope["path"], scope["method"]
        error = None
        if method == "OPTIONS" and cors:
            return await _respond(send, 204, b"", cors)
        if method == "OPTIONS":
            error = APIError(400, f"CORS preflight from origin {headers.get('origin')!r} is not allowed; "
                                  "the server's --allowed-origins decides which origins may call it")
        elif config.api_key and path != "/health" and not _key_matches(headers, config.api_key):
            error = APIError(401, "missing or wrong API key; send 'Authorization: Bearer <key>' or 'X-Api-Key: <key>'")
        elif headers.get("content-length", "").isdigit() and int(headers["content-length"]) > config.max_request_bytes:
            error = APIError(413, f"the request body has {headers['content-length']} bytes; the limit is "
                                  f"{config.max_request_bytes} (--max-request-bytes)")
        elif method == "POST" and not is_json_media_type(headers.get("content-type")):
            error = APIError(415, f"Content-Type {headers['content-type'][:80]!r} is not supported; send the body "
                                  "as JSON with 'Content-Type: application/json'")
        elif self.state.shutting_down and method == "POST" and _generates(path):
            error = APIError(503, "the server is shutting down; send the request to another instance")
        if error is not None:
            return await _respond(send, error.status, json.dumps(error_body_for(path, error)).encode(),
                                  {**cors, "content-type": "application/json"})

        async def send_with_cors(message):
            if message["type"] == "http.response.start" and cors:
                message = {**message, "headers": list(message.get("headers", [])) +
                           [(k.encode(), v.encode()) for k, v in cors.items()]}
            await send(message)

        await self.app(scope, receive, send_with_cors)


def _key_matches(headers: dict[str, str], key: str) -> bool:
    bearer = hmac.compare_digest(headers.get("authorization", "").encode(), f"Bearer {key}".encode())
    x_api_key = hmac.compare_digest(headers.get("x-api-key", "").encode(), key.encode())   # both: no timing leak
    return bearer or x_api_key


async def _respond(send, status: int, body: bytes, headers: dict[str, str]) -> None:
    raw = [(k.encode(), v.encode()) for k, v in headers.items()] + [(b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


class ClientGone(Exception):
    """The client disconnected; its work was cancelled and nobody is left to answer."""


async def unless_disconnected(receive, work):
    """Await ``work`` (a coroutine) while watching ``receive`` for the client leaving; if it leaves
    first, cancel the work (its ``finally`` blocks abort engine requests) and raise ``ClientGone``."""
    async def wait_disconnect():
        while (await receive())["type"] != "http.disconnect":
            pass

    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(wait_disconnect())
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
    if not task.done() or task.cancelled():
        raise ClientGone()
    return task.result()


class DisconnectAwareResponse(Response):
    """A non-streaming response computed while watching for the client to leave: if it does,
    the computation is cancelled and ``on_close`` aborts the engine requests at once. ``on_close``
    runs however the response ends (it must be idempotent)."""

    def __init__(self, produce, on_close):
        super().__init__()
        self.produce = produce
        self.on_close = on_close

    async def __call__(self, scope, receive, send):
        try:
            response = await unless_disconnected(receive, self.produce())
        except ClientGone:
            return
        finally:
            self.on_close()
        await response(scope, receive, send)


class ClosingStreamingResponse(StreamingResponse):
    """A stream whose ``on_close`` (idempotent) runs however the response ends. The body's own
    ``finally`` is not enough: a client gone before the first chunk cancels the response before the
    body iterator ever starts, and an iterator never started runs no ``finally``."""

    def __init__(self, content, on_close, **kwargs):
        super().__init__(content, **kwargs)
        self.on_close = on_close

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.on_close()
