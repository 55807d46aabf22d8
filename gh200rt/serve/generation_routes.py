"""The OpenAI generation routes: completions, chat completions, embeddings, and SageMaker's ``/invocations``
(any of their bodies). Each answers with and without its ``/v1`` prefix (llama.cpp's clients leave it out)."""
from __future__ import annotations

import asyncio
import dataclasses
import functools
import uuid

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from gh200rt.serve.chat_request import parse_chat_request
from gh200rt.serve.embeddings import create_embeddings
from gh200rt.serve.errors import bad_request
from gh200rt.serve.generation import GenerationRun
from gh200rt.serve.guard import ClientGone, ClosingStreamingResponse, DisconnectAwareResponse, unless_disconnected
from gh200rt.serve.lora_routes import adapters
from gh200rt.serve.protocol import check_token_ids, model_name, parse_completion_request, resolve_whole_vocab, show
from gh200rt.serve.reasoning import reasoning_gate
from gh200rt.serve.responses import completion_body
from gh200rt.serve.tokenizer_routes import chat_token_ids


def add_generation_routes(app: FastAPI, state) -> None:
    async def completion(body: dict):
        parsed = parse_completion_request(body, state.max_logprobs)
        return await generate(state, parsed, state.check_model(parsed.model), chat=False)

    async def chat_completion(body: dict):
        parsed, messages = parse_chat_request(body, state.config.tool_call_parser, state.config.enable_auto_tool_choice,
                                              state.max_logprobs, state.config.reasoning_parser)
        model = state.check_model(parsed.model)
        return await generate(state, parsed, model, chat=True, render=chat_render(state, parsed, messages))

    @app.post("/v1/completions")
    @app.post("/completions")
    async def completions(request: Request):
        return await while_connected(request, completion(await state.read_json(request)))

    @app.post("/v1/chat/completions")
    @app.post("/chat/completions")
    async def chat_completions(request: Request):
        return await while_connected(request, chat_completion(await state.read_json(request)))

    async def embedding(body: dict):
        model = state.check_model(model_name(body))
        lora_name = model if model in adapters(state) else None
        return JSONResponse(await create_embeddings(state, body, model, lora_name))

    @app.post("/v1/embeddings")
    @app.post("/embeddings")
    async def embeddings(request: Request):
        return await while_connected(request, embedding(await state.read_json(request)))

    @app.post("/invocations")
    async def invocations(request: Request):
        body = await state.read_json(request)
        if "messages" in body:
            return await while_connected(request, chat_completion(body))
        if "prompt" in body:
            return await while_connected(request, completion(body))
        if "input" in body:
            return await while_connected(request, embedding(body))
        raise bad_request("/invocations takes a chat completion body (with 'messages'), a completion body (with "
                          "'prompt') or an embeddings body (with 'input')", "messages")


def chat_render(state, parsed, messages: list[dict]):
    """The blocking call that renders a parsed chat request's messages through the template into token ids."""
    tools = parsed.extra["tools"]
    return functools.partial(chat_token_ids, state.ready_engine().tokenizer, messages,
                             parsed.extra["add_generation_prompt"], parsed.extra["continue_final_message"],
                             tools.tools if tools else None, parsed.add_special_tokens,
                             **state.trusted(parsed.extra["template_options"]))


async def while_connected(request: Request, work):
    """Tokenizing, waiting to be queued, queued: a client that leaves at any point cancels ``work``,
    which aborts whatever engine requests it had started, and nobody is answered."""
    try:
        return await unless_disconnected(request.receive, work)
    except ClientGone:
        return Response(status_code=499)


def tokenized(tok, prompts: list[tuple[str | None, list[int] | None]], render=None,
              add_special_tokens: bool = True) -> list[tuple[str | None, list[int]]]:
    if render is not None:                      # chat: the template, rendered and tokenized
        return [(None, render())]
    return [(text, ids if ids is not None else list(tok.encode(text, add_special_tokens=add_special_tokens)))
            for text, ids in prompts]


def truncated(truncation, prompts: list[tuple[str | None, list[int]]], max_model_len: int,
              max_tokens: int | None) -> list[tuple[str | None, list[int]]]:
    """The prompts cut to what ``truncation`` keeps; a cut prompt loses its text, so echo shows the kept tokens."""
    result = []
    for text, ids in prompts:
        kept = truncation.apply(ids, max_model_len, max_tokens)
        result.append((text if len(kept) == len(ids) else None, kept))
    return result


async def start_run(state, parsed, model: str, kind: str, render=None) -> GenerationRun:
    """Admit (or 503 at once), tokenize, check and submit; the run the engine accepted (or a 400). ``render`` (chat)
    is a blocking call that returns the prompt's token ids; ``kind`` prefixes the engine's request ids ("chatcmpl",
    "cmpl", "resp", "msg")."""
    engine = state.ready_engine()
    gate_grammar_after_reasoning(parsed, engine.tokenizer)
    num_prompts = 1 if render is not None else len(parsed.prompts)
    ticket = state.admission.admit(num_prompts * parsed.params.n, "prompt" if parsed.params.n == 1 else "n")
    run = GenerationRun(state.engine, kind, parsed, state.metrics, ticket,
                        lora_name=model if model in adapters(state) else None)
    try:
        # Tokenized here, off the event loop, so a long prompt stalls neither other handlers nor the engine thread.
        parsed.prompts = await asyncio.to_thread(tokenized, engine.tokenizer, parsed.prompts, render,
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
            parsed.prompts = truncated(parsed.truncation, parsed.prompts, engine.max_model_len, max_tokens)
        await run.start()
    except BaseException:                       # a 400, or the client gone: the slots go back at once
        run.close(count_abort=False)
        raise
    return run


def gate_grammar_after_reasoning(parsed, tokenizer) -> None:
    """A constrained chat answer under a reasoning parser: its grammar holds after the ``<think>`` block; where the
    block's tags cannot be told by their tokens, the answer has no block (the grammar from the first token)."""
    parser = parsed.extra.get("reasoning")
    if parser is None or parsed.params.structured_output is None:
        return
    gate = reasoning_gate(tokenizer, parser)
    if gate is None:
        parsed.extra["reasoning"] = None
    else:
        parsed.params = dataclasses.replace(parsed.params, reasoning_gate=gate)


async def generate(state, parsed, model: str, chat: bool, render=None):
    """Start the run (``start_run``); then answer in one body or as a stream."""
    if parsed.stream and state.config.enable_force_include_usage:
        parsed.include_usage = True
    run = await start_run(state, parsed, model, "chatcmpl" if chat else "cmpl", render)
    request_id = f"{'chatcmpl' if chat else 'cmpl'}-{parsed.request_id or uuid.uuid4().hex}"
    headers = {"x-request-id": parsed.request_id} if parsed.request_id else {}
    tok = state.ready_engine().tokenizer
    if parsed.stream:
        from gh200rt.serve.streaming import stream_chat, stream_completion
        body = (stream_chat if chat else stream_completion)(run, request_id, model, tok)
        return ClosingStreamingResponse(body, run.close, media_type="text/event-stream",
                                        headers={"cache-control": "no-cache", "x-accel-buffering": "no", **headers})

    async def produce() -> JSONResponse:
        per_choice = await run.collect()
        return JSONResponse(completion_body(tok, run, model, chat, request_id, per_choice), headers=headers)
    return DisconnectAwareResponse(produce, run.close)
