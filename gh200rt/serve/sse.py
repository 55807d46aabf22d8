"""Server-Sent Events framing as OpenAI clients expect it: ``data: {json}\\n\\n`` per chunk and
``data: [DONE]\\n\\n`` last. No keep-alive comments.

The JSON keeps text as UTF-8 (``ensure_ascii=False``) but escapes U+0085, U+2028 and U+2029: SSE ends a line
only at CR or LF, yet clients that read the stream with Python's ``str.splitlines`` (httpx's ``aiter_lines``
among them) also break lines there, and a model can generate those characters; escaped, a chunk is always one
line and decodes to the same text.
"""
from __future__ import annotations

import json

DONE = b"data: [DONE]\n\n"
_LINE_BREAKS = {"\x85": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"}   # json.dumps escapes the others


def sse_event(payload: dict) -> bytes:
    text = json.dumps(payload, separators=(",", ":"), ensure_ascii=False)
    for char, escaped in _LINE_BREAKS.items():
        if char in text:
            text = text.replace(char, escaped)
    return b"data: " + text.encode() + b"\n\n"
