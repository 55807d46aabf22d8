"""The OpenAI error body and the exception that carries it to the HTTP layer.

Handlers raise ``APIError``; the app turns it into ``{"error": {"message", "type", "param",
"code"}}`` with its status. 4xx are the client's fault and say what to change; 5xx are ours.
"""
from __future__ import annotations

from fastapi.responses import JSONResponse

_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
          405: "invalid_request_error", 413: "invalid_request_error", 415: "invalid_request_error", 503: "service_unavailable",
          500: "internal_server_error"}


class APIError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers            # e.g. Retry-After on a 503 for overload

    def body(self) -> dict:
        return error_body(self.status, self.message, self.param, self.code)


def error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": _TYPES.get(status, "invalid_request_error"),
                      "param": param, "code": code if code is not None else status}}


def bad_request(message: str, param: str | None = None) -> APIError:
    return APIError(400, message, param)


def error_response(e: APIError) -> JSONResponse:
    """``e`` as the HTTP response: its body, status and headers."""
    return JSONResponse(e.body(), status_code=e.status, headers=e.headers)
