"""Pure-ASGI middleware for the cross-cutting rules: CORS (preflight answered without a key),
the API key on every route but /health, 413 for oversized bodies, 503 once shutdown began.

Pure ASGI on purpose: Starlette's BaseHTTPMiddleware hides client disconnects from handlers,
and disconnect detection is what frees a vanished client's KV blocks.
"""
from __future__ import annotations

import asyncio
import hmac
import json

from starlette.responses import Response

from gh200rt.serve.errors import APIError


def cors_headers(origins: tuple[str, ...], origin: str | None) -> dict[str, str]:
    if origin is None or not origins or ("*" not in origins and origin not in origins):
        return {}
    return {"access-control-allow-origin": "*" if "*" in origins else origin, "vary": "Origin",
            "access-control-allow-methods": "GET, POST, OPTIONS",
            "access-control-allow-headers": "authorization, content-type",
            "access-control-max-age": "600"}


class Guard:
    def __init__(self, app, state):
        self.app = app
        self.state = state

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        config = self.state.config
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        cors = cors_headers(config.origins, headers.get("origin"))
        path, method = scope["path"], scope["method"]
        error = None
        if method == "OPTIONS" and cors:
            return await _respond(send, 204, b"", cors)
        if method == "OPTIONS":
            error = APIError(400, f"CORS preflight from origin {headers.get('origin')!r} is not allowed; "
                                  "the server's --allowed-origins decides which origins may call it")
        elif config.api_key and path != "/health" and not _key_matches(headers.get("authorization"), config.api_key):
            error = APIError(401, "missing or wrong API key; send 'Authorization: Bearer <key>'")
        elif headers.get("content-length", "").isdigit() and int(headers["content-length"]) > config.max_request_bytes:
            error = APIError(413, f"the request body has {headers['content-length']} bytes; the limit is "
                                  f"{config.max_request_bytes} (--max-request-bytes)")
        elif self.state.shutting_down and method == "POST" and path.startswith("/v1/"):
            error = APIError(503, "the server is shutting down; send the request to another instance")
        if error is not None:
            return await _respond(send, error.status, json.dumps(error.body()).encode(),
                                  {**cors, "content-type": "application/json"})

        async def send_with_cors(message):
            if message["type"] == "http.response.start" and cors:
                message = {**message, "headers": list(message.get("headers", [])) +
                           [(k.encode(), v.encode()) for k, v in cors.items()]}
            await send(message)

        await self.app(scope, receive, send_with_cors)


def _key_matches(header: str | None, key: str) -> bool:
    return hmac.compare_digest((header or "").encode(), f"Bearer {key}".encode())     # no timing leak


async def _respond(send, status: int, body: bytes, headers: dict[str, str]) -> None:
    raw = [(k.encode(), v.encode()) for k, v in headers.items()] + [(b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


class DisconnectAwareResponse(Response):
    """A non-streaming response computed while watching for the client to leave: if it does,
    the computation is cancelled and ``on_disconnect`` aborts the engine requests at once."""

    def __init__(self, produce, on_disconnect):
        super().__init__()
        self.produce = produce
        self.on_disconnect = on_disconnect

    async def __call__(self, scope, receive, send):
        async def wait_disconnect():
            while (await receive())["type"] != "http.disconnect":
                pass

        work = asyncio.ensure_future(self.produce())
        watcher = asyncio.ensure_future(wait_disconnect())
        try:
            await asyncio.wait({work, watcher}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            watcher.cancel()
            if not work.done():
                work.cancel()
                self.on_disconnect()
        if work.cancelled():
            return
        await work.result()(scope, receive, send)
