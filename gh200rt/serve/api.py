"""The FastAPI app: OpenAI routes over an ``AsyncEngine``, plus health, metrics and tokenizer routes.

Every OpenAI route answers with and without its ``/v1`` prefix (llama.cpp's clients leave it out), and
``/invocations`` (SageMaker) takes any of their bodies: ``messages`` is a chat completion, ``prompt`` a completion,
``input`` an embeddings request (``embeddings``).

Cross-cutting rules (CORS, API key, 413, 503 on shutdown) live in ``guard.Guard``; reading and
checking a body lives in ``body``, its fields in ``protocol``; how many requests are held at once
(503 with Retry-After beyond that) in ``admission``. Every failure leaves as the OpenAI error body;
the only 5xx are 503 (loading, overload, shutdown) and 500 for real internal faults.
"""
from __future__ import annotations

import asyncio
import functools
import logging
import time
import uuid

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

import gh200rt
from gh200rt.serve.admission import Admission
from gh200rt.serve.args import ServerConfig
from gh200rt.serve.async_engine import AsyncEngine
from gh200rt.serve.body import parse_json_object, read_body
from gh200rt.serve.embeddings import create_embeddings
from gh200rt.serve.errors import APIError, bad_request, error_body
from gh200rt.serve.fields import DETOKENIZE, REFUSED, TOKENIZE, declared, refuse_unhonoured
from gh200rt.serve.fields import TEMPLATE as CHAT_TEMPLATE_FIELDS
from gh200rt.serve.generation import GenerationRun
from gh200rt.serve.guard import (ClientGone, ClosingStreamingResponse, DisconnectAwareResponse, Guard,
                                 unless_disconnected)
from gh200rt.serve.lora_routes import adapter_card, adapters, add_lora_routes
from gh200rt.serve.metrics import ServerMetrics
from gh200rt.serve.chat_request import parse_chat_request, parse_messages, template_flags, template_options
from gh200rt.serve.protocol import (DEFAULT_MAX_LOGPROBS, check_token_ids, model_name, parse_completion_request,
                                    resolve_whole_vocab, show)
from gh200rt.serve.responses import completion_body
from gh200rt.serve.tokenizer_info import token_strings, tokenizer_info

log = logging.getLogger("gh200rt.serve")


def _error(e: APIError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status, headers=e.headers)


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


def create_app(state: ServerState) -> FastAPI:
    app = FastAPI(title="gh200rt", docs_url=None, redoc_url=None, openapi_url=None)
    app.add_middleware(Guard, state=state)

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
        return parse_json_object(await read_body(request, state.config.max_request_bytes))

    def check_model(name: str | None) -> str:
        """The name responses show: the served name, or the LoRA adapter ``name`` picks."""
        if name is not None and name not in state.model_names:
            if name in adapters(state):
                return name
            known = sorted(state.model_names | set(adapters(state)))
            raise APIError(404, f"model {show(name)} is not served here; use one of {known}", "model",
                           "model_not_found")
        return state.served_name

    @app.get("/health")
    async def health():
        if state.engine.load_error is not None:
            return _error(APIError(503, f"the model failed to load: {state.engine.load_error}"))
        if not state.engine.ready.is_set():
            return _error(APIError(503, "the model is loading"))
        if not state.engine.alive:
            return _error(APIError(503, "the engine thread has stopped; restart the server (see its log)"))
        if state.shutting_down:
            return _error(APIError(503, "the server is shutting down"))
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
        check_model(name)
        entry = adapters(state).get(name)
        return state.model_card(name) if entry is None else adapter_card(state, entry)

    @app.get("/metrics")
    async def metrics():
        text = state.metrics.render(state.engine.num_pending, state.served_name, state.admission,
                                    len(asyncio.all_tasks()))
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4")

    @app.post("/tokenize")
    async def tokenize(request: Request):
        body = declared(await read_json(request), TOKENIZE, "/tokenize")
        refuse_unhonoured(body, {"mm_processor_kwargs": REFUSED["mm_processor_kwargs"]})
        check_model(model_name(body))
        if "messages" not in body:
            for name in (*CHAT_TEMPLATE_FIELDS, "tools"):
                if body.get(name) is not None:
                    raise bad_request(f"'{name}' shapes the rendering of 'messages' through the chat template; give "
                                      f"'messages', or leave '{name}' out with 'prompt'", name)
        tok = state.ready_engine().tokenizer
        if "messages" in body:
            messages = parse_messages(body["messages"])
            add_generation_prompt, continue_final = template_flags(body, messages)
            tools = body.get("tools")
            if tools is not None and not isinstance(tools, list):
                raise bad_request(f"'tools' must be a list of function tools, got {show(tools)}", "tools")
            options = trusted(template_options(body))
            ids = await asyncio.to_thread(chat_token_ids, tok, messages, add_generation_prompt, continue_final, tools,
                                          _flag(body, "add_special_tokens", False), **options)
        elif isinstance(body.get("prompt"), str):
            ids = list(await asyncio.to_thread(tok.encode, body["prompt"], _flag(body, "add_special_tokens", True)))
        else:
            raise bad_request("give 'prompt' (a string) or 'messages'", "prompt")
        strs = token_strings(tok, ids) if _flag(body, "return_token_strs", False) else None
        return {"tokens": ids, "token_strs": strs, "count": len(ids), "max_model_len": state.ready_engine().max_model_len}

    @app.get("/tokenizer_info")
    async def get_tokenizer_info():
        return tokenizer_info(state.ready_engine().tokenizer)

    @app.post("/detokenize")
    async def detokenize(request: Request):
        body = declared(await read_json(request), DETOKENIZE, "/detokenize")
        check_model(model_name(body))
        engine = state.ready_engine()
        ids = check_token_ids(body.get("tokens"), "tokens", engine.vocab_size, allow_empty=True)
        return {"prompt": engine.tokenizer.decode(ids, skip_special_tokens=False)}

    def trusted(options: dict) -> dict:
        """Template options with a request's own ``chat_template`` only if the server trusts request templates:
        the sandbox keeps a template from the host but cannot bound the time or memory it takes."""
        if "chat_template" in options and not state.config.trust_request_chat_template:
            raise bad_request("this server renders only the model's chat template: a request's 'chat_template' is "
                              "used when the server runs with --trust-request-chat-template (vLLM's flag), as "
                              "rendering one can take unbounded time and memory; leave 'chat_template' out",
                              "chat_template")
        return options

    async def completion(body: dict):
        parsed = parse_completion_request(body, state.max_logprobs)
        return await _generate(state, parsed, check_model(parsed.model), chat=False)

    async def chat_completion(body: dict):
        parsed, messages = parse_chat_request(body, state.config.tool_call_parser, state.config.enable_auto_tool_choice,
                                              state.max_logprobs)
        model = check_model(parsed.model)
        tok = state.ready_engine().tokenizer
        tools = parsed.extra["tools"]
        render = functools.partial(chat_token_ids, tok, messages, parsed.extra["add_generation_prompt"],
                                   parsed.extra["continue_final_message"], tools.tools if tools else None,
                                   parsed.add_special_tokens, **trusted(parsed.extra["template_options"]))
        return await _generate(state, parsed, model, chat=True, render=render)

    @app.post("/v1/completions")
    @app.post("/completions")
    async def completions(request: Request):
        return await _while_connected(request, completion(await read_json(request)))

    @app.post("/v1/chat/completions")
    @app.post("/chat/completions")
    async def chat_completions(request: Request):
        return await _while_connected(request, chat_completion(await read_json(request)))

    async def embedding(body: dict):
        model = check_model(model_name(body))
        lora_name = model if model in adapters(state) else None
        return JSONResponse(await create_embeddings(state, body, model, lora_name))

    @app.post("/v1/embeddings")
    @app.post("/embeddings")
    async def embeddings(request: Request):
        return await _while_connected(request, embedding(await read_json(request)))

    @app.post("/invocations")
    async def invocations(request: Request):
        body = await read_json(request)
        if "messages" in body:
            return await _while_connected(request, chat_completion(body))
        if "prompt" in body:
            return await _while_connected(request, completion(body))
        if "input" in body:
            return await _while_connected(request, embedding(body))
        raise bad_request("/invocations takes a chat completion body (with 'messages'), a completion body (with "
                          "'prompt') or an embeddings body (with 'input')", "messages")

    add_lora_routes(app, state, read_json)
    return app


async def _while_connected(request: Request, work):
    """Tokenizing, waiting to be queued, queued: a client that leaves at any point cancels ``work``,
    which aborts whatever engine requests it had started, and nobody is answered."""
    try:
        return await unless_disconnected(request.receive, work)
    except ClientGone:
        return Response(status_code=499)


def chat_token_ids(tok, messages: list[dict], add_generation_prompt: bool, continue_final_message: bool = False,
                   tools: list[dict] | None = None, add_special_tokens: bool = False, chat_template: str | None = None,
                   template_kwargs: dict | None = None) -> list[int]:
    """The rendered template, tokenized without adding special tokens (it already holds any BOS it wants) unless
    vLLM's ``add_special_tokens`` asks for the tokenizer's on top of it. ``chat_template``: the request's own
    template; ``template_kwargs``: vLLM's ``chat_template_kwargs``, more variables for the template."""
    options = {"continue_final_message": True} if continue_final_message else {}
    if tools:
        options["tools"] = tools
    if chat_template is not None:
        options["chat_template"] = chat_template
    options.update(template_kwargs or {})
    try:
        if add_special_tokens:
            text = tok.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=False,
                                           **options)
            return list(tok.encode(text, add_special_tokens=True))
        return list(tok.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=True,
                                            **options))
    except Exception as e:                      # templates reject conversations they cannot render
        if chat_template is not None:
            raise bad_request(f"the request's chat_template failed: {type(e).__name__}: {e}", "chat_template") from e
        raise bad_request(f"the chat template rejected these messages: {type(e).__name__}: {e}", "messages") from e


def _flag(body: dict, name: str, default: bool) -> bool:
    value = body.get(name, default)
    if not isinstance(value, bool):
        raise bad_request(f"'{name}' must be true or false, got {show(value)}", name)
    return value


def _tokenized(tok, prompts: list[tuple[str | None, list[int] | None]], render=None,
               add_special_tokens: bool = True) -> list[tuple[str | None, list[int]]]:
    if render is not None:                      # chat: the template, rendered and tokenized
        return [(None, render())]
    return [(text, ids if ids is not None else list(tok.encode(text, add_special_tokens=add_special_tokens)))
            for text, ids in prompts]


def _truncated(truncation, prompts: list[tuple[str | None, list[int]]], max_model_len: int,
               max_tokens: int | None) -> list[tuple[str | None, list[int]]]:
    """The prompts cut to what ``truncation`` keeps; a cut prompt loses its text, so echo shows the kept tokens."""
    result = []
    for text, ids in prompts:
        kept = truncation.apply(ids, max_model_len, max_tokens)
        result.append((text if len(kept) == len(ids) else None, kept))
    return result


async def _generate(state: ServerState, parsed, model: str, chat: bool, render=None):
    """Admit (or 503 at once), tokenize, submit; then answer in one body or as a stream. ``render`` (chat)
    is a blocking call that returns the prompt's token ids."""
    engine = state.ready_engine()
    num_prompts = 1 if render is not None else len(parsed.prompts)
    ticket = state.admission.admit(num_prompts * parsed.params.n, "prompt" if parsed.params.n == 1 else "n")
    run = GenerationRun(state.engine, "chatcmpl" if chat else "cmpl", parsed, state.metrics, ticket,
                        lora_name=model if model in adapters(state) else None)
    try:
        # Tokenized here, off the event loop, so a long prompt stalls neither other handlers nor the engine thread.
        parsed.prompts = await asyncio.to_thread(_tokenized, engine.tokenizer, parsed.prompts, render,
                                                 parsed.add_special_tokens)
        for _text, ids in parsed.prompts:
            check_token_ids(ids, "prompt", engine.vocab_size)
        for name in ("stop_token_ids", "logprob_token_ids", "allowed_token_ids"):
            check_token_ids(getattr(parsed.params, name) or [], name, engine.vocab_size, allow_empty=True)
        resolve_whole_vocab(parsed, engine.vocab_size, state.max_logprobs)
        max_tokens = parsed.params.max_tokens
        if max_tokens is not None and max_tokens >= engine.max_model_len:
            raise bad_request(f"'max_tokens' is {show(max_tokens)} but max_model_len is {engine.max_model_len}, "
                              "which must also hold the prompt; lower max_tokens", "max_tokens")
        if parsed.truncation is not None:
            parsed.prompts = _truncated(parsed.truncation, parsed.prompts, engine.max_model_len, max_tokens)
        await run.start()
    except BaseException:                       # a 400, or the client gone: the slots go back at once
        run.close(count_abort=False)
        raise
    request_id = f"{'chatcmpl' if chat else 'cmpl'}-{parsed.request_id or uuid.uuid4().hex}"
    headers = {"x-request-id": parsed.request_id} if parsed.request_id else {}
    tok = engine.tokenizer
    if parsed.stream:
        from gh200rt.serve.streaming import stream_chat, stream_completion
        body = (stream_chat if chat else stream_completion)(run, request_id, model, tok)
        return ClosingStreamingResponse(body, run.close, media_type="text/event-stream",
                                        headers={"cache-control": "no-cache", "x-accel-buffering": "no", **headers})

    async def produce() -> JSONResponse:
        per_choice = await run.collect()
        return JSONResponse(completion_body(tok, run, model, chat, request_id, per_choice), headers=headers)
    return DisconnectAwareResponse(produce, run.close)
