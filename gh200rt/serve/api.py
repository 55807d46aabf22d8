"""The FastAPI app: OpenAI routes over an ``AsyncEngine``, plus health, metrics and tokenizer routes.

Cross-cutting rules (CORS, API key, 413, 503 on shutdown) live in ``guard.Guard``. Every failure
leaves as the OpenAI error body; only real internal faults are 500.
"""
from __future__ import annotations

import json
import logging
import time
import uuid

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse

import gh200rt
from gh200rt.serve.args import ServerConfig
from gh200rt.serve.async_engine import AsyncEngine
from gh200rt.serve.errors import APIError, bad_request, error_body
from gh200rt.serve.generation import GenerationRun
from gh200rt.serve.guard import DisconnectAwareResponse, Guard
from gh200rt.serve.metrics import ServerMetrics
from gh200rt.serve.protocol import parse_chat_request, parse_completion_request, parse_messages
from gh200rt.serve.responses import chat_logprobs, completion_logprobs, envelope, usage

log = logging.getLogger("gh200rt.serve")


def _error(e: APIError, headers=None) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status, headers=headers)


class ServerState:
    def __init__(self, config: ServerConfig, engine: AsyncEngine, model_path: str):
        self.config = config
        self.model_path = model_path
        self.served_name = config.served_model_name or model_path
        self.model_names = {self.served_name, model_path}
        self.engine = engine
        self.metrics = ServerMetrics()
        engine.metrics = self.metrics
        self.shutting_down = False


def create_app(state: ServerState) -> FastAPI:
    app = FastAPI(title="gh200rt", docs_url=None, redoc_url=None, openapi_url=None)
    app.add_middleware(Guard, state=state)
    config = state.config

    @app.exception_handler(APIError)
    async def api_error(_request: Request, e: APIError):
        return _error(e)

    @app.exception_handler(Exception)
    async def internal_error(request: Request, e: Exception):       # a real fault; never user input
        log.exception("internal error on %s", request.url.path)
        return JSONResponse(error_body(500, f"internal server error: {type(e).__name__}"), status_code=500)

    @app.exception_handler(404)
    async def not_found(request: Request, _e):
        return _error(APIError(404, f"no route {request.method} {request.url.path}"))

    @app.exception_handler(405)
    async def bad_method(request: Request, _e):
        return _error(APIError(405, f"{request.method} is not allowed on {request.url.path}"))

    async def read_json(request: Request) -> dict:
        raw = await request.body()
        if len(raw) > config.max_request_bytes:
            raise APIError(413, f"the request body is larger than {config.max_request_bytes} bytes")
        try:
            body = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as e:
            raise bad_request(f"the body is not valid JSON: {e}") from e
        if not isinstance(body, dict):
            raise bad_request("the body must be a JSON object")
        return body

    def check_model(name) -> str:
        if name is not None and name not in state.model_names:
            raise APIError(404, f"model {name!r} is not served here; use one of {sorted(state.model_names)}",
                           "model", "model_not_found")
        return state.served_name

    def tokenizer():
        if not state.engine.ready.is_set():
            raise APIError(503, "the model is still loading; retry when GET /health answers 200")
        return state.engine.engine.tokenizer

    @app.get("/health")
    async def health():
        if state.engine.load_error is not None:
            return _error(APIError(503, f"the model failed to load: {state.engine.load_error}"))
        if not state.engine.ready.is_set():
            return _error(APIError(503, "the model is loading"))
        if state.shutting_down:
            return _error(APIError(503, "the server is shutting down"))
        return {"status": "ok"}

    @app.get("/version")
    async def version():
        return {"version": gh200rt.__version__}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": state.served_name, "object": "model", "created": 0,
                                            "owned_by": "gh200rt", "root": state.model_path,
                                            "max_model_len": _max_model_len(state)}]}

    @app.get("/metrics")
    async def metrics():
        return PlainTextResponse(state.metrics.render(state.engine.num_pending),
                                 media_type="text/plain; version=0.0.4")

    @app.post("/tokenize")
    async def tokenize(request: Request):
        body = await read_json(request)
        tok = tokenizer()
        if "messages" in body:
            text = tok.apply_chat_template(parse_messages(body["messages"]),
                                           add_generation_prompt=bool(body.get("add_generation_prompt", True)))
        elif isinstance(body.get("prompt"), str):
            text = body["prompt"]
        else:
            raise bad_request("give 'prompt' (a string) or 'messages'", "prompt")
        ids = list(tok.encode(text))
        return {"tokens": ids, "count": len(ids), "max_model_len": _max_model_len(state)}

    @app.post("/detokenize")
    async def detokenize(request: Request):
        body = await read_json(request)
        ids = body.get("tokens")
        if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
            raise bad_request("'tokens' must be a list of token ids", "tokens")
        vocab = state.engine.engine.vocab_size if state.engine.ready.is_set() else 0
        bad = [t for t in ids if not 0 <= t < vocab]
        tok = tokenizer()
        if bad:
            raise bad_request(f"token ids {bad[:5]} are outside the vocabulary [0, {vocab})", "tokens")
        return {"prompt": tok.decode(ids, skip_special_tokens=False)}

    @app.post("/v1/completions")
    async def completions(request: Request):
        parsed = parse_completion_request(await read_json(request))
        model = check_model(parsed.model)
        return await _generate(state, request, parsed, model, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        parsed, messages = parse_chat_request(await read_json(request))
        model = check_model(parsed.model)
        tok = tokenizer()
        try:
            prompt = tok.apply_chat_template(messages, add_generation_prompt=parsed.extra["add_generation_prompt"])
        except Exception as e:
            raise bad_request(f"the chat template rejected these messages: {e}", "messages") from e
        parsed.prompts = [(prompt, None)]
        return await _generate(state, request, parsed, model, chat=True)

    return app


def _max_model_len(state: ServerState):
    return state.engine.engine.max_model_len if state.engine.ready.is_set() else None


async def _generate(state: ServerState, request: Request, parsed, model: str, chat: bool):
    run = GenerationRun(state.engine, "chatcmpl" if chat else "cmpl", parsed, state.metrics)
    await run.start()
    request_id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
    tok = state.engine.engine.tokenizer
    if parsed.stream:
        from gh200rt.serve.streaming import stream_chat, stream_completion
        body = (stream_chat if chat else stream_completion)(run, request_id, model, tok)
        return StreamingResponse(body, media_type="text/event-stream",
                                 headers={"cache-control": "no-cache", "x-accel-buffering": "no"})
    async def produce() -> JSONResponse:
        per_choice = await run.collect()
        return JSONResponse(_full_body(tok, parsed, model, chat, request_id, run, per_choice))
    return DisconnectAwareResponse(produce, run.close)


def _full_body(tok, parsed, model: str, chat: bool, request_id: str, run, per_choice) -> dict:
    created = int(time.time())
    n = parsed.params.n
    choices = []
    for index in range(len(parsed.prompts) * n):
        deltas = per_choice.get(index, [])
        text = "".join(d.text for d in deltas)
        finish = next((d.finish_reason for d in reversed(deltas) if d.finish_reason), None)
        stop_reason = next((d.stop_reason for d in reversed(deltas) if d.finish_reason), None)
        if chat:
            lp = chat_logprobs(tok, deltas, parsed.logprobs) if parsed.logprobs is not None else None
            choices.append({"index": index, "message": {"role": "assistant", "content": text},
                            "logprobs": lp, "finish_reason": finish, "stop_reason": stop_reason})
        else:
            prefix = _echo_text(tok, parsed, index // n) if parsed.echo else ""
            lp = completion_logprobs(tok, deltas, len(prefix)) if parsed.logprobs is not None else None
            choices.append({"index": index, "text": prefix + text, "logprobs": lp, "finish_reason": finish,
                            "stop_reason": stop_reason})
    body = envelope(request_id, "chat.completion" if chat else "text_completion", model, choices, created)
    body["usage"] = usage(run.prompt_tokens, run.completion_tokens)
    return body


def _echo_text(tok, parsed, prompt_index: int) -> str:
    text, ids = parsed.prompts[prompt_index]
    return text if text is not None else tok.decode(ids, skip_special_tokens=False)
