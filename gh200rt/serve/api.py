"""The FastAPI app: OpenAI routes over an ``AsyncEngine``, plus health, metrics and tokenizer routes, one module per
group (``status_routes``, ``tokenizer_routes``, ``generation_routes``, ``lora_routes``, ``responses_routes``: OpenAI's
Responses API) over the ``ServerState``
they share (``state``).

Every OpenAI route answers with and without its ``/v1`` prefix (llama.cpp's clients leave it out), and
``/invocations`` (SageMaker) takes any of their bodies: ``messages`` is a chat completion, ``prompt`` a completion,
``input`` an embeddings request (``embeddings``).

Cross-cutting rules (CORS, API key, 413, 503 on shutdown) live in ``guard.Guard``; reading and
checking a body lives in ``body``, its fields in ``protocol``; how many requests are held at once
(503 with Retry-After beyond that) in ``admission``. Every failure leaves as the OpenAI error body (Anthropic's
on the Messages routes, ``messages_routes``);
the only 5xx are 503 (loading, overload, shutdown) and 500 for real internal faults.
"""
from __future__ import annotations

import logging

from fastapi import FastAPI, Request

from gh200rt.serve.errors import APIError
from gh200rt.serve.generation_routes import add_generation_routes
from gh200rt.serve.guard import Guard
from gh200rt.serve.lora_routes import add_lora_routes
from gh200rt.serve.messages_errors import error_response_for
from gh200rt.serve.messages_routes import add_messages_routes
from gh200rt.serve.responses_routes import add_responses_routes
from gh200rt.serve.state import ServerState
from gh200rt.serve.status_routes import add_status_routes
from gh200rt.serve.tokenizer_routes import add_tokenizer_routes

log = logging.getLogger("gh200rt.serve")


def create_app(state: ServerState) -> FastAPI:
    app = FastAPI(title="gh200rt", docs_url=None, redoc_url=None, openapi_url=None)
    app.add_middleware(Guard, state=state)

    @app.exception_handler(APIError)
    async def api_error(request: Request, e: APIError):
        return error_response_for(request.url.path, e)

    @app.exception_handler(Exception)
    async def internal_error(request: Request, e: Exception):       # a real fault; never user input
        log.exception("internal error on %s", request.url.path)
        return error_response_for(request.url.path, APIError(500, f"internal server error: {type(e).__name__}"))

    @app.exception_handler(404)
    async def not_found(request: Request, _e):
        return error_response_for(request.url.path, APIError(404, f"no route {request.method} {request.url.path}"))

    @app.exception_handler(405)
    async def bad_method(request: Request, _e):
        path = request.url.path
        return error_response_for(path, APIError(405, f"{request.method} is not allowed on {path}"))

    add_status_routes(app, state)
    add_tokenizer_routes(app, state)
    add_generation_routes(app, state)
    add_lora_routes(app, state)
    add_responses_routes(app, state)
    add_messages_routes(app, state)
    return app
