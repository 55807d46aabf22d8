"""POST /v1/embeddings (and /embeddings): OpenAI's request and response over the engine's embedding requests.

``input`` is a string, a list of strings, a list of token ids or a list of lists of token ids; each becomes one
engine request (pooled as ``--pooling-type`` says, engine/pooling.py) and one ``data`` entry with its ``index``.
``encoding_format`` "float" gives lists of numbers, "base64" the little-endian float32 bytes (as OpenAI and vLLM
do; OpenAI's Python client asks for base64 by default). ``dimensions`` must equal the model's hidden size: these
models cannot shorten their embeddings. ``user`` is informational, as in OpenAI's API. vLLM's ``normalize``,
``add_special_tokens``, ``truncate_prompt_tokens`` and ``truncation_side`` are honoured. Any other field is a 400:
this request is small and fully known, so nothing a client sends is silently ignored.
"""
from __future__ import annotations

import asyncio
import base64
import struct
import time
import uuid
from dataclasses import dataclass

from gh200rt.engine.outputs import EmbeddingRequestOutput
from gh200rt.pooling_params import PoolingParams
from gh200rt.serve.async_engine import AsyncEngine
from gh200rt.serve.errors import APIError, bad_request
from gh200rt.serve.fields import declared
from gh200rt.serve.protocol import check_token_ids, flag, integer, model_name, parse_prompts, show
from gh200rt.serve.truncation import PromptTruncation, parse_truncation

ENCODING_FORMATS = ("float", "base64")
FIELDS = ("input", "model", "encoding_format", "dimensions", "user", "normalize", "add_special_tokens",
          "truncate_prompt_tokens", "truncation_side")


@dataclass
class EmbeddingRequest:
    inputs: list[tuple[str | None, list[int] | None]]    # (text, token ids): exactly one is set
    params: PoolingParams
    encoding_format: str = "float"
    model: str | None = None
    add_special_tokens: bool = True
    truncation: PromptTruncation | None = None


def parse_embedding_request(body: dict) -> EmbeddingRequest:
    unknown = sorted(set(body) - set(FIELDS))
    if unknown:
        raise bad_request(f"{show(unknown[0])} is not a field of an embeddings request; this server takes "
                          f"{', '.join(FIELDS)}", unknown[0])
    body = declared(body, FIELDS)
    if "input" not in body:
        raise bad_request("'input' is required: a string, a list of strings, a list of token ids or a list of lists "
                          "of token ids", "input")
    encoding = body.get("encoding_format", "float")
    if encoding not in ENCODING_FORMATS:
        raise bad_request(f"'encoding_format' must be \"float\" or \"base64\", got {show(encoding)}", "encoding_format")
    dimensions = integer(body, "dimensions", None, lo=1, what="a positive integer")
    if body.get("user") is not None and not isinstance(body["user"], str):
        raise bad_request(f"'user' must be a string, got {show(body['user'])}", "user")
    params = PoolingParams(normalize=flag(body, "normalize", True), dimensions=dimensions)
    return EmbeddingRequest(parse_prompts(body["input"], "input"), params, encoding, model_name(body),
                            flag(body, "add_special_tokens", True), parse_truncation(body))


def token_ids(request: EmbeddingRequest, tokenizer, vocab_size: int, max_model_len: int) -> list[list[int]]:
    """Each input's token ids, cut as ``truncate_prompt_tokens`` says; a 400 for one longer than max_model_len."""
    result = []
    for i, (text, ids) in enumerate(request.inputs):
        if ids is None:
            ids = list(tokenizer.encode(text, add_special_tokens=request.add_special_tokens))
        check_token_ids(ids, "input", vocab_size)
        if request.truncation is not None:
            ids = request.truncation.apply(ids, max_model_len, None)
        if len(ids) > max_model_len:
            raise bad_request(f"input {i} has {len(ids)} tokens but max_model_len is {max_model_len}; shorten it, "
                              f"send truncate_prompt_tokens (-1 keeps as many as fit), or start the server with a "
                              f"larger --max-model-len", "input")
        result.append(ids)
    return result


async def embed(engine: AsyncEngine, inputs: list[list[int]], params: PoolingParams,
                lora_name: str | None = None) -> list[EmbeddingRequestOutput]:
    """Submit every input (under the LoRA adapter ``lora_name``, if any) and wait for all their vectors; whatever
    ends this early (an input the engine refuses, the client gone) aborts the rest, which frees their KV blocks at
    once."""
    ids = [engine.new_request_id("embd") for _ in inputs]
    sink: asyncio.Queue = asyncio.Queue()
    pending: set[str] = set()
    done: dict[str, EmbeddingRequestOutput] = {}
    try:
        for rid, tokens in zip(ids, inputs):
            engine.add(rid, None, tokens, params, sink=sink, lora_name=lora_name)
            pending.add(rid)
        while pending:
            kind, rid, payload = await sink.get()
            if kind == "error":
                raise payload
            if kind == "output":
                done[rid] = payload
                pending.discard(rid)
        return [done[rid] for rid in ids]
    finally:
        for rid in pending:
            engine.abort(rid)
        for rid in ids:
            engine.finished(rid)


def encode(vector: list[float], encoding_format: str) -> list[float] | str:
    if encoding_format == "float":
        return vector
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")


def embedding_body(outputs: list[EmbeddingRequestOutput], model: str, encoding_format: str) -> dict:
    tokens = sum(len(out.prompt_token_ids) for out in outputs)
    return {"id": f"embd-{uuid.uuid4().hex}", "object": "list", "created": int(time.time()), "model": model,
            "data": [{"object": "embedding", "index": i, "embedding": encode(out.outputs.embedding, encoding_format)}
                     for i, out in enumerate(outputs)],
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}


async def create_embeddings(state, body: dict, model: str, lora_name: str | None = None) -> dict:
    """The whole request: parse, admit (or 503), tokenize off the event loop, embed (under the LoRA adapter
    ``model`` names, ``lora_name``), answer; counted in the server's request metrics as generation requests are."""
    request = parse_embedding_request(body)
    engine, metrics = state.ready_engine(), state.metrics
    arrival = time.monotonic()
    metrics.count("requests_received_total")
    try:
        ticket = state.admission.admit(len(request.inputs), "input")
    except APIError:
        metrics.count("requests_rejected_total")
        raise
    started = False
    try:
        try:
            request.params.check_dimensions(engine.arch.hidden_size)
        except ValueError as e:
            raise bad_request(str(e), "dimensions") from e
        inputs = await asyncio.to_thread(token_ids, request, engine.tokenizer, engine.vocab_size, engine.max_model_len)
        started = True
        outputs = await embed(state.engine, inputs, request.params, lora_name)
    except APIError as e:
        metrics.count("requests_rejected_total" if e.status == 400 or not started else "requests_aborted_total")
        raise
    except asyncio.CancelledError:
        metrics.count("requests_aborted_total")
        metrics.request_aborted()
        raise
    finally:
        ticket.release()
    metrics.observe(metrics.e2e, time.monotonic() - arrival)
    metrics.count("requests_success_total")
    metrics.count("prompt_tokens_total", sum(len(ids) for ids in inputs))
    for out in outputs:
        metrics.request_pooled(out)
    return embedding_body(outputs, model, request.encoding_format)
