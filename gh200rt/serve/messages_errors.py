"""Anthropic's error body, ``{"type": "error", "error": {"type", "message"}}``, for every failure on the Messages
routes (``/v1/messages``, ``/v1/messages/count_tokens``, with or without ``/v1``); every other route keeps OpenAI's.

The status stays the one the server chose (``APIError``): Anthropic's clients pick their exception by status, and
retry 429 and 5xx with the ``Retry-After`` the server sends. Overload, loading and shutdown are 503 here, as on every
route, typed ``overloaded_error`` as Anthropic types its 529.
"""
from __future__ import annotations

from fastapi.responses import JSONResponse

from gh200rt.serve.errors import APIError

MESSAGES_PATHS = ("/v1/messages", "/messages", "/v1/messages/count_tokens", "/messages/count_tokens")
_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
          404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 500: "api_error",
          503: "overloaded_error", 529: "overloaded_error"}


def speaks_anthropic(path: str) -> bool:
    return path.rstrip("/") in MESSAGES_PATHS


def anthropic_error_body(status: int, message: str) -> dict:
    kind = _TYPES.get(status, "invalid_request_error" if status < 500 else "api_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def error_body_for(path: str, e: APIError) -> dict:
    """``e``'s body in the shape the route at ``path`` speaks."""
    return anthropic_error_body(e.status, e.message) if speaks_anthropic(path) else e.body()


def error_response_for(path: str, e: APIError) -> JSONResponse:
    return JSONResponse(error_body_for(path, e), status_code=e.status, headers=e.headers)
