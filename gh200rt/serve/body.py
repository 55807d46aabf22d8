"""Reading a request body: at most ``limit`` bytes (413 beyond, even without a Content-Length),
strict JSON (no NaN / Infinity, nothing nested absurdly deep), a JSON object, and text that
can be encoded as UTF-8 (no unpaired surrogates such as ``"\\ud800"``), so nothing later can
fail on it. Every violation is an ``APIError`` that says what was wrong.
"""
from __future__ import annotations

import json
import math

from gh200rt.serve.errors import APIError, bad_request


async def read_body(request, limit: int) -> bytes:
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise APIError(413, f"the request body is larger than {limit} bytes (--max-request-bytes)")
        chunks.append(chunk)
    return b"".join(chunks)


def _no_constants(name: str):
    raise ValueError(f"{name} is not a JSON number; send a finite number")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"the number {text[:40]} is out of range; send a finite number")
    return value


def parse_json_object(raw: bytes) -> dict:
    try:
        body = json.loads(raw, parse_constant=_no_constants, parse_float=_finite)
    except RecursionError:
        raise bad_request("the body is not valid JSON: it is nested too deeply") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise bad_request(f"the body is not valid JSON: {e}") from None
    if not isinstance(body, dict):
        raise bad_request(f"the body must be a JSON object, got a JSON {type(body).__name__}")
    _check_text(body)
    return body


def _check_text(body: dict) -> None:
    """Walk the body without recursion; name the first string that is not valid Unicode text."""
    stack: list[tuple[str, object]] = [("", body)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, dict):
            for key, item in value.items():
                _check_string(key, path or "body")
                stack.append((f"{path}.{key}" if path else key, item))
        elif isinstance(value, list):
            stack.extend((f"{path}[{i}]", item) for i, item in enumerate(value) if isinstance(item, (str, list, dict)))
        elif isinstance(value, str):
            _check_string(value, path)


def _check_string(text: str, path: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise bad_request(f"'{path}' holds an unpaired UTF-16 surrogate ({text[e.start]!r} at {e.start}); "
                          "send valid Unicode text", path.split(".")[0].split("[")[0] or None) from None
