"""Health, version, model list and metrics routes."""
from __future__ import annotations

import asyncio

from fastapi import FastAPI
from fastapi.responses import PlainTextResponse

import gh200rt
from gh200rt.serve.errors import APIError, error_response
from gh200rt.serve.lora_routes import adapter_card, adapters


def add_status_routes(app: FastAPI, state) -> None:
    @app.get("/health")
    async def health():
        if state.engine.load_error is not None:
            return error_response(APIError(503, f"the model failed to load: {state.engine.load_error}"))
        if not state.engine.ready.is_set():
            return error_response(APIError(503, "the model is loading"))
        if not state.engine.alive:
            return error_response(APIError(503, "the engine thread has stopped; restart the server (see its log)"))
        if state.shutting_down:
            return error_response(APIError(503, "the server is shutting down"))
        return {"status": "ok"}

    @app.get("/version")
    async def version():
        return {"version": gh200rt.__version__}

    @app.get("/v1/models")
    @app.get("/models")
    async def models():
        return {"object": "list", "data": [state.model_card(name) for name in state.served_names] +
                [adapter_card(state, entry) for entry in adapters(state).values()]}

    @app.get("/v1/models/{name:path}")
    @app.get("/models/{name:path}")
    async def model(name: str):
        state.check_model(name)
        entry = adapters(state).get(name)
        return state.model_card(name) if entry is None else adapter_card(state, entry)

    @app.get("/load")
    async def load():
        if not state.config.enable_server_load_tracking:
            raise APIError(404, "server load tracking is off; start the server with --enable-server-load-tracking")
        return {"server_load": state.admission.requests}

    @app.get("/metrics")
    async def metrics():
        text = state.metrics.render(state.engine.num_pending, state.served_name, state.admission,
                                    len(asyncio.all_tasks()))
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4")

