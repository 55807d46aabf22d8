"""The request fields each route reads or refuses, declared once.

A parser reads its body through ``declared(body, FIELDS)``, which asserts that every field it reads is
declared here, so these lists are exactly what the parsers take; tests/unit/test_api_docs.py checks that
README.md's API tables name every one of them. Every route refuses a field in none of its lists
(``reject_unknown``): a field the server does not honour is a 400, never accepted and ignored.
"""
from __future__ import annotations

from gh200rt.serve.errors import bad_request
from gh200rt.serve.llamacpp_fields import FIELDS as LLAMACPP_FIELDS
from gh200rt.serve.structured_fields import CONSTRAINT_FIELDS
from gh200rt.serve.tools import TOOL_FIELDS
from gh200rt.serve.truncation import TRUNCATION_FIELDS

# What a refused field may hold and still ask for nothing: null always; with ``EMPTY`` any JSON false value (false,
# 0, "", [], {}); with ``ABSENT`` nothing else; else the values listed (the field's default).
EMPTY, ABSENT = "empty", "absent"


def _leave_out(what: str, name: str) -> str:
    return f"{what}; leave '{name}' out"


# Known OpenAI / vLLM fields this server cannot honour, on completions and chat: a 400 naming the field when the
# value asks for something (field -> (what asks for nothing, the message)).
REFUSED = {
    "use_beam_search": (EMPTY, _leave_out("beam search is not supported by this server", "use_beam_search")),
    "length_penalty": ((1.0,), "'length_penalty' applies to beam search, which this server does not support; leave "
                            "it out or 1"),
    "lora_request": (EMPTY, "a LoRA adapter is chosen by 'model' (a name from GET /v1/models), as in vLLM; leave "
                            "'lora_request' out"),
    "lora_name": (EMPTY, "a LoRA adapter is chosen by 'model' (a name from GET /v1/models), as in vLLM; leave "
                         "'lora_name' out"),
    "multi_modal_data": (EMPTY, "images, audio and video are not supported by this server (text-only models)"),
    "mm_processor_kwargs": (EMPTY, "images, audio and video are not supported by this server (text-only models)"),
    "media_io_kwargs": (EMPTY, "images, audio and video are not supported by this server (text-only models)"),
    "audio": (EMPTY, _leave_out("audio output is not supported by this server", "audio")),
    "modalities": ((["text"],), "this server answers with text only; leave 'modalities' out or [\"text\"]"),
    "logits_processors": (EMPTY, _leave_out("custom logits processors are not supported by this server; use "
                                            "'logit_bias', 'allowed_token_ids', 'bad_words' or an output constraint "
                                            "instead", "logits_processors")),
    "guided_decoding_backend": (ABSENT, _leave_out("the output-constraint backend is llguidance, chosen by the "
                                                   "server", "guided_decoding_backend")),
    "guided_whitespace_pattern": (ABSENT, _leave_out("JSON output constraints allow JSON's own whitespace; a "
                                                     "custom pattern is not supported", "guided_whitespace_pattern")),
    "watermarking": (EMPTY, _leave_out("watermarking is not supported by this server", "watermarking")),
    "repetition_detection": (ABSENT, "repetition detection is not supported by this server; leave "
                                     "'repetition_detection' out and bound the answer with 'max_tokens'"),
    "thinking_token_budget": (ABSENT, _leave_out("this server cannot bound the thinking tokens apart from the "
                                                 "answer's (bound both with 'max_tokens')", "thinking_token_budget")),
    "vllm_xargs": (EMPTY, _leave_out("this server runs no custom extensions", "vllm_xargs")),
    "routed_experts_prompt_start": ((0,), "this server does not return routed-expert data; leave "
                                       "'routed_experts_prompt_start' out or 0"),
    "return_token_offsets": (EMPTY, "token offsets are returned only by vLLM's render routes, which this server "
                                    "does not have; leave 'return_token_offsets' out"),
    "return_mm_kwargs": ((True,), "multimodal render data is not returned by this server (text-only models); leave "
                               "'return_mm_kwargs' out"),
    "session_id": (ABSENT, _leave_out("sessions are not tracked by this server (each request stands alone)",
                                      "session_id")),
    "stream_interval": ((1,), "this server streams every token as it is generated; leave 'stream_interval' out or 1"),
    "store": ((False,), "stored completions are not supported by this server; leave 'store' out or false"),
    "service_tier": (("auto", "default"), "this server has one service tier; leave 'service_tier' out, \"auto\" or "
                                "\"default\""),
    "prediction": (ABSENT, _leave_out("predicted outputs are not supported by this server", "prediction")),
    "prompt_cache_key": (ABSENT, "the prefix cache needs no key on this server (it matches prompts by their "
                                 "tokens); leave 'prompt_cache_key' out, or send 'cache_salt' to keep requests' "
                                 "caches apart"),
    "cache_prompt": ((True,), "llama.cpp's 'cache_prompt' lets a request reuse cached KV if possible; this server "
                              "sets its prefix cache for all requests (--enable-prefix-caching), not per request; "
                              "leave 'cache_prompt' out or true"),
    "priority": ((0,), "this server schedules first come, first served (no priority scheduling); leave 'priority' "
                    "out or 0"),
    "spaces_between_special_tokens": ((True,), "the detokenizer decodes special tokens as the tokenizer does and has "
                                            "no way to leave out spaces between them; leave "
                                            "'spaces_between_special_tokens' out or true"),
    "kv_transfer_params": (ABSENT, "disaggregated prefill (KV transfer between instances) is not supported by this "
                                   "server; leave 'kv_transfer_params' out or send the request to a vLLM "
                                   "prefill/decode pair"),
    "ec_transfer_params": (ABSENT, "encoder-cache transfer between instances is not supported by this server "
                                   "(text-only models); leave 'ec_transfer_params' out"),
}
COMPLETION_REFUSED = {
    "prompt_embeds": (ABSENT, "prompt embeddings are not supported by this server; send 'prompt' as text or token "
                              "ids"),
}
CHAT_REFUSED = {
    "documents": (EMPTY, _leave_out("documents (RAG) are not passed to chat templates by this server; put them in "
                                    "a message", "documents")),
    "reasoning_effort": (ABSENT, _leave_out("this server has no reasoning-effort control; "
                                            "a template's own switch goes in 'chat_template_kwargs' (e.g. "
                                            "{\"enable_thinking\": false})", "reasoning_effort")),
    # honoured where the server has a --reasoning-parser (chat_request.py)
    "include_reasoning": ((True,), "this server runs no --reasoning-parser: reasoning stays in the answer's content, "
                                "so it cannot be left out; leave 'include_reasoning' out or true"),
    "return_prompt_text": (EMPTY, "the rendered prompt is not returned by this server; see it through POST "
                                  "/tokenize with 'return_token_strs'; leave 'return_prompt_text' out"),
    "web_search_options": (ABSENT, "web search is not supported by this server; leave 'web_search_options' out"),
    "functions": (EMPTY, "the legacy 'functions' field is not supported; send them as 'tools'"),
    "function_call": (ABSENT, "the legacy 'function_call' field is not supported; send 'tool_choice'"),
    "verbosity": (ABSENT, _leave_out("answer verbosity is not adjustable on this server", "verbosity")),
}

SAMPLING = ("n", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "min_p",
            "repetition_penalty", "presence_penalty", "frequency_penalty", "seed", "stop", "stop_token_ids",
            "include_stop_str_in_output", "ignore_eos", "min_tokens", "skip_special_tokens", "logit_bias",
            "logprob_token_ids", "allowed_token_ids", "bad_words")
STREAM_OPTIONS = ("include_usage", "continuous_usage_stats")        # keys of ``stream_options``
RESPONSE = ("stream", "stream_options", "return_token_ids", "return_tokens_as_token_ids", "prompt_logprobs",
            "request_id", "user", "safety_identifier", "metadata")
# Read by completions and chat alike: the shared table of the README.
GENERATION = ("model", "best_of", "cache_salt", *SAMPLING, *RESPONSE, *TRUNCATION_FIELDS, *CONSTRAINT_FIELDS,
              *REFUSED, *LLAMACPP_FIELDS)
TEMPLATE = ("add_generation_prompt", "continue_final_message", "chat_template", "chat_template_kwargs")
COMPLETION_ONLY = ("prompt", "echo", "logprobs", "add_special_tokens", "suffix", *COMPLETION_REFUSED)
CHAT_ONLY = ("messages", "logprobs", "top_logprobs", "echo", *TEMPLATE, "add_special_tokens", *TOOL_FIELDS,
             *CHAT_REFUSED)
# /v1/responses (OpenAI's Responses API, responses_request.py): what it reads, and what it refuses
RESPONSES_REFUSED = {
    "background": ((False,), "background responses are not supported by this server (a response is generated while "
                             "its request is open; stream it to see it grow); leave 'background' out or false"),
    "truncation": (("disabled",), "the input is never cut to fit by this server: a too-long conversation is a 400 "
                                  "naming its length; leave 'truncation' out or \"disabled\""),
    "service_tier": REFUSED["service_tier"],
    "prompt": (ABSENT, _leave_out("stored prompt templates are not kept by this server; send 'instructions' and "
                                  "'input'", "prompt")),
    "conversation": (ABSENT, _leave_out("conversation objects are not kept by this server; continue a stored "
                                        "response with 'previous_response_id'", "conversation")),
    "max_tool_calls": (ABSENT, _leave_out("a response makes at most one round of function calls here (the client "
                                          "runs them); bound that round with 'parallel_tool_calls'",
                                          "max_tool_calls")),
    "prompt_cache_key": REFUSED["prompt_cache_key"],
}
RESPONSES = ("model", "input", "instructions", "previous_response_id", "store", "stream", "stream_options", "tools",
             "tool_choice", "parallel_tool_calls", "max_output_tokens", "temperature", "top_p", "top_logprobs", "text",
             "reasoning", "include", "metadata", "user", "safety_identifier", *RESPONSES_REFUSED,
             # vLLM's sampling extensions, as on chat (responses_request.SAMPLING_EXTRAS)
             "top_k", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty", "seed", "stop",
             "stop_token_ids", "ignore_eos", "min_tokens")
COMPLETION = GENERATION + COMPLETION_ONLY
CHAT = GENERATION + CHAT_ONLY
TOKENIZE = ("model", "prompt", "messages", "add_special_tokens", *TEMPLATE, "tools", "return_token_strs",
            "mm_processor_kwargs")
DETOKENIZE = ("model", "tokens")


def asks_nothing(value, accepted) -> bool:
    """Whether a refused field's ``value`` leaves the server nothing to do (``accepted``: see ``REFUSED``)."""
    if value is None or accepted == EMPTY and not value:
        return True
    if accepted in (EMPTY, ABSENT):
        return False
    return any(value == a and isinstance(value, bool) == isinstance(a, bool) for a in accepted)


def refuse_unhonoured(body: dict, refused: dict) -> None:
    """A 400 naming the first field of ``refused`` whose value asks for something."""
    for name, (accepted, message) in refused.items():
        if name in body and not asks_nothing(body[name], accepted):
            raise bad_request(message, name)


def reject_unknown(body: dict, fields: tuple[str, ...], route: str) -> None:
    """A 400 naming the first field that ``route`` does not declare, as a strict schema would."""
    unknown = [name for name in body if name not in fields]
    if unknown:
        raise bad_request(f"unknown field {unknown[0]!r} on {route}: this server reads only the fields in the "
                          "README's API tables (HTTP API) and refuses others rather than ignore them; correct its "
                          "name or leave it out", unknown[0])


class DeclaredBody(dict):
    """A request body whose parser may read only the declared fields (an internal invariant, hence asserts):
    a parser that starts reading a new field fails its tests until the field is declared, and so documented."""

    def __init__(self, body: dict, fields: tuple[str, ...]):
        super().__init__(body)
        self.fields = frozenset(fields)

    def get(self, key, default=None):
        assert key in self.fields, f"the parser reads {key!r}, which gh200rt/serve/fields.py does not declare"
        return super().get(key, default)

    def __getitem__(self, key):
        assert key in self.fields, f"the parser reads {key!r}, which gh200rt/serve/fields.py does not declare"
        return super().__getitem__(key)

    def __contains__(self, key):
        assert key in self.fields, f"the parser reads {key!r}, which gh200rt/serve/fields.py does not declare"
        return super().__contains__(key)


def declared(body: dict, fields: tuple[str, ...], route: str | None = None) -> DeclaredBody:
    """``body`` as its parser may read it; with ``route``, a field not in ``fields`` is a 400 first."""
    if route is not None:
        reject_unknown(body, fields, route)
    return DeclaredBody(body, fields)
