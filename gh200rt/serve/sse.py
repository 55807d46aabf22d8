"""Server-Sent Events framing as OpenAI clients expect it: ``data: {json}\\n\\n`` per chunk and
``data: [DONE]\\n\\n`` last. No keep-alive comments."""
from __future__ import annotations

import json

DONE = b"data: [DONE]\n\n"


def sse_event(payload: dict) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode() + b"\n\n"
