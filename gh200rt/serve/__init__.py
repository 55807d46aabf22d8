"""The OpenAI-compatible HTTP server (``python -m gh200rt.serve``).

body (size limit, strict JSON) -> protocol (request validation) -> async_engine (one engine thread,
asyncio queues) -> generation (per-request runs, abort on disconnect) -> api / streaming /
responses (OpenAI bodies and SSE), with guard (key, CORS, limits, shutdown) in front and metrics
(Prometheus text) alongside. No user input may produce a 5xx or stop the engine thread.
"""
