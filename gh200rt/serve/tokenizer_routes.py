"""Tokenizer routes (vLLM's ``/tokenize``, ``/detokenize``, ``/tokenizer_info``) and the chat template's rendering,
which ``/tokenize`` and chat completions share."""
from __future__ import annotations

import asyncio

from fastapi import FastAPI, Request

from gh200rt.serve.chat_request import parse_messages, template_flags, template_options
from gh200rt.serve.errors import bad_request
from gh200rt.serve.fields import DETOKENIZE, REFUSED, TOKENIZE, declared, refuse_unhonoured
from gh200rt.serve.fields import TEMPLATE as CHAT_TEMPLATE_FIELDS
from gh200rt.serve.protocol import check_token_ids, model_name, show
from gh200rt.serve.tokenizer_info import token_strings, tokenizer_info


def add_tokenizer_routes(app: FastAPI, state) -> None:
    @app.post("/tokenize")
    async def tokenize(request: Request):
        body = declared(await state.read_json(request), TOKENIZE, "/tokenize")
        refuse_unhonoured(body, {"mm_processor_kwargs": REFUSED["mm_processor_kwargs"]})
        state.check_model(model_name(body))
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
            options = state.trusted(template_options(body))
            ids = await asyncio.to_thread(chat_token_ids, tok, messages, add_generation_prompt, continue_final, tools,
                                          flag(body, "add_special_tokens", False), **options)
        elif isinstance(body.get("prompt"), str):
            ids = list(await asyncio.to_thread(tok.encode, body["prompt"], flag(body, "add_special_tokens", True)))
        else:
            raise bad_request("give 'prompt' (a string) or 'messages'", "prompt")
        strs = token_strings(tok, ids) if flag(body, "return_token_strs", False) else None
        return {"tokens": ids, "token_strs": strs, "count": len(ids),
                "max_model_len": state.ready_engine().max_model_len}

    @app.get("/tokenizer_info")
    async def get_tokenizer_info():
        return tokenizer_info(state.ready_engine().tokenizer)

    @app.post("/detokenize")
    async def detokenize(request: Request):
        body = declared(await state.read_json(request), DETOKENIZE, "/detokenize")
        state.check_model(model_name(body))
        engine = state.ready_engine()
        ids = check_token_ids(body.get("tokens"), "tokens", engine.vocab_size, allow_empty=True)
        return {"prompt": engine.tokenizer.decode(ids, skip_special_tokens=False)}



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


def flag(body: dict, name: str, default: bool) -> bool:
    value = body.get(name, default)
    if not isinstance(value, bool):
        raise bad_request(f"'{name}' must be true or false, got {show(value)}", name)
    return value
