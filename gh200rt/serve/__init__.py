"""The OpenAI-compatible HTTP server (``python -m gh200rt.serve``).

body (size limit, strict JSON) -> protocol (request validation) -> admission (a bounded number of
sequences held; 503 with Retry-After beyond it, before any work) -> async_engine (one engine thread,
asyncio queues) -> generation (per-request runs, abort on disconnect) -> api / streaming /
responses (OpenAI bodies and SSE), with guard (key, CORS, limits, shutdown) in front and metrics
(Prometheus text) alongside. No user input may produce a 5xx or stop the engine thread; the only
5xx a client sees are 503 (loading, overload, shutdown) and 500 for a fault of ours.
"""
