"""LoRA adapters over HTTP, as vLLM serves them: a request's ``model`` names the base model or an adapter,
``/v1/models`` lists adapters (``parent``: the base model), and with ``--enable-runtime-lora-updating``
``POST /v1/load_lora_adapter`` (``{"lora_name", "lora_path"}``) and ``/v1/unload_lora_adapter``
(``{"lora_name"}``) change them at run time, answering vLLM's plain-text ``Success: ...``.

The engine thread owns the adapter registry: a load reads and checks the adapter files in a worker thread,
then registers it through ``AsyncEngine.call``; an unload removes the name (requests already running under it
finish with it).
"""
from __future__ import annotations

import asyncio

from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse

from gh200rt.lora.peft_adapter import LoraAdapterError
from gh200rt.lora.registry import UnknownAdapter
from gh200rt.serve.errors import APIError, bad_request
from gh200rt.serve.protocol import show

LOAD_FIELDS = {"lora_name", "lora_path", "load_inplace"}
UNLOAD_FIELDS = {"lora_name", "lora_int_id"}


def adapters(state) -> dict:
    """Name -> ``AdapterEntry`` of the adapters served now ({} without --enable-lora or while loading)."""
    engine = state.engine.engine if state.engine.ready.is_set() else None
    registry = getattr(engine, "lora", None)
    return dict(registry.by_name) if registry is not None else {}


def adapter_card(state, entry) -> dict:
    card = state.model_card(entry.name)
    return {**card, "root": entry.path, "parent": entry.base_model_name or state.served_name}


def _fields(body: dict, allowed: set[str], route: str) -> None:
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise bad_request(f"{route} does not take {', '.join(map(show, unknown))}; it takes "
                          f"{', '.join(sorted(allowed))}", unknown[0])


def _name(body: dict, key: str) -> str | None:
    value = body.get(key)
    if value is not None and (not isinstance(value, str) or not value):
        raise bad_request(f"'{key}' must be a non-empty string, got {show(value)}", key)
    return value


def add_lora_routes(app: FastAPI, state) -> None:
    def registry():
        engine = state.ready_engine()
        if engine.lora is None or not engine.config.lora.enable_runtime_lora_updating:
            raise APIError(404, "loading and unloading LoRA adapters at run time is off; start the server with "
                                "--enable-lora --enable-runtime-lora-updating")
        return engine.lora

    @app.post("/v1/load_lora_adapter")
    @app.post("/load_lora_adapter")
    async def load_lora_adapter(request: Request):
        body = await state.read_json(request)
        reg = registry()
        _fields(body, LOAD_FIELDS, "/v1/load_lora_adapter")
        name, path = _name(body, "lora_name"), _name(body, "lora_path")
        if name is None or path is None:
            raise bad_request("Both 'lora_name' and 'lora_path' must be provided.", "lora_name" if name is None
                              else "lora_path")
        if body.get("load_inplace") not in (None, False):
            raise bad_request("'load_inplace' is not supported: unload the adapter first, then load it again",
                              "load_inplace")
        if name in state.model_names or name in reg.by_name:
            raise bad_request(f"The lora adapter '{name}' has already been loaded.", "lora_name")
        try:
            adapter = await asyncio.to_thread(reg.read, path)
            await state.engine.call(lambda engine: engine.add_lora(name, path, adapter=adapter))
        except LoraAdapterError as e:
            raise APIError(404 if "no such directory" in str(e) else 400, str(e), "lora_path") from e
        except ValueError as e:             # taken meanwhile
            raise bad_request(str(e), "lora_name") from e
        return PlainTextResponse(f"Success: LoRA adapter '{name}' added successfully.")

    @app.post("/v1/unload_lora_adapter")
    @app.post("/unload_lora_adapter")
    async def unload_lora_adapter(request: Request):
        body = await state.read_json(request)
        registry()
        _fields(body, UNLOAD_FIELDS, "/v1/unload_lora_adapter")
        name = _name(body, "lora_name")
        if name is None:
            raise bad_request("'lora_name' must be provided.", "lora_name")
        try:
            await state.engine.call(lambda engine: engine.remove_lora(name))
        except UnknownAdapter:
            raise APIError(404, f"The lora adapter '{name}' cannot be found.", "lora_name",
                           "model_not_found") from None
        return PlainTextResponse(f"Success: LoRA adapter '{name}' removed successfully.")
