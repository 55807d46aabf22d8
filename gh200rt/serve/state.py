"""``ServerState``: what every route of the app reads (the config, the engine, admission, metrics, the served
names), and the checks routes share: a request's ``model``, its own chat template, its JSON body."""
from __future__ import annotations

import time

from fastapi import Request

from gh200rt.serve.admission import Admission
from gh200rt.serve.args import ServerConfig
from gh200rt.serve.async_engine import AsyncEngine
from gh200rt.serve.body import parse_json_object, read_body
from gh200rt.serve.errors import APIError, bad_request
from gh200rt.serve.lora_routes import adapters
from gh200rt.serve.metrics import ServerMetrics
from gh200rt.serve.protocol import DEFAULT_MAX_LOGPROBS, show
from gh200rt.serve.responses_store import ResponsesStore


class ServerState:
    def __init__(self, config: ServerConfig, engine: AsyncEngine, model_path: str, admission: Admission,
                 max_logprobs: int = DEFAULT_MAX_LOGPROBS):
        self.config = config
        self.max_logprobs = max_logprobs         # the engine's --max-logprobs, checked as requests are parsed
        self.admission = admission
        self.model_path = model_path
        names = config.served_model_name or (model_path,)
        self.served_names = names
        self.served_name = names[0]
        self.model_names = {*names, model_path}
        self.engine = engine
        self.metrics = ServerMetrics()
        engine.metrics = self.metrics
        self.shutting_down = False
        self.started = int(time.time())
        self.responses = ResponsesStore(config.max_stored_responses)   # /v1/responses (responses_store.py)

    def ready_engine(self):
        """The loaded LLMEngine, or 503 while it loads (or if it failed)."""
        if not self.engine.ready.is_set():
            raise APIError(503, "the model is still loading; retry when GET /health answers 200")
        return self.engine.engine

    def model_card(self, name: str | None = None) -> dict:
        engine = self.engine.engine if self.engine.ready.is_set() else None
        return {"id": name or self.served_name, "object": "model", "created": self.started, "owned_by": "gh200rt",
                "root": self.model_path, "parent": None,
                "max_model_len": engine.max_model_len if engine is not None else None}

    async def read_json(self, request: Request) -> dict:
        """The request's body as a JSON object, within --max-request-bytes."""
        return parse_json_object(await read_body(request, self.config.max_request_bytes))

    def check_model(self, name: str | None) -> str:
        """The name responses show: the served name, or the LoRA adapter ``name`` picks."""
        if name is not None and name not in self.model_names:
            if name in adapters(self):
                return name
            known = sorted(self.model_names | set(adapters(self)))
            raise APIError(404, f"model {show(name)} is not served here; use one of {known}", "model",
                           "model_not_found")
        return self.served_name

    def trusted(self, options: dict) -> dict:
        """Template options with a request's own ``chat_template`` only if the server trusts request templates:
        the sandbox keeps a template from the host but cannot bound the time or memory it takes."""
        if "chat_template" in options and not self.config.trust_request_chat_template:
            raise bad_request("this server renders only the model's chat template: a request's 'chat_template' is "
                              "used when the server runs with --trust-request-chat-template (vLLM's flag), as "
                              "rendering one can take unbounded time and memory; leave 'chat_template' out",
                              "chat_template")
        return options
