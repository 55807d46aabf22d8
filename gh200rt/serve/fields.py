"""The request fields each route reads or refuses, declared once.

A parser reads its body through ``declared(body, FIELDS)``, which asserts that every field it reads is
declared here, so these lists are exactly what the parsers take; tests/unit/test_api_docs.py checks that
README.md's API tables name every one of them. On completions, chat and /tokenize a field in no list is
ignored on purpose (benchmark clients send extras); embeddings and the LoRA routes refuse any field they do
not declare.
"""
from __future__ import annotations

from gh200rt.serve.structured_fields import CONSTRAINT_FIELDS
from gh200rt.serve.tools import TOOL_FIELDS
from gh200rt.serve.truncation import TRUNCATION_FIELDS

# Known OpenAI / vLLM fields this server cannot honour: a 400 naming the field when the value asks for something.
REFUSED = {
    "use_beam_search": "beam search is not supported by this server; leave 'use_beam_search' out",
    "lora_request": "a LoRA adapter is chosen by 'model' (a name from GET /v1/models), as in vLLM; leave "
                    "'lora_request' out",
    "lora_name": "a LoRA adapter is chosen by 'model' (a name from GET /v1/models), as in vLLM; leave 'lora_name' "
                 "out",
    "multi_modal_data": "images, audio and video are not supported by this server (text-only models)",
    "mm_processor_kwargs": "images, audio and video are not supported by this server (text-only models)",
    "audio": "audio output is not supported by this server; leave 'audio' out",
}
# Refused whenever present, even empty: these ask for a mechanism this server does not have.
REFUSED_EVEN_EMPTY = {
    "kv_transfer_params": "disaggregated prefill (KV transfer between instances) is not supported by this server; "
                          "leave 'kv_transfer_params' out or send the request to a vLLM prefill/decode pair",
}

SAMPLING = ("n", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "min_p",
            "repetition_penalty", "presence_penalty", "frequency_penalty", "seed", "stop", "stop_token_ids",
            "include_stop_str_in_output", "ignore_eos", "min_tokens", "skip_special_tokens", "logit_bias",
            "logprob_token_ids", "allowed_token_ids")
STREAM_OPTIONS = ("include_usage", "continuous_usage_stats")        # keys of ``stream_options``
RESPONSE = ("stream", "stream_options", "return_token_ids", "return_tokens_as_token_ids", "prompt_logprobs", "user")
# Read by completions and chat alike: the shared table of the README.
GENERATION = ("model", "best_of", *SAMPLING, *RESPONSE, *TRUNCATION_FIELDS, *CONSTRAINT_FIELDS, *REFUSED,
              *REFUSED_EVEN_EMPTY)
COMPLETION_ONLY = ("prompt", "echo", "logprobs", "add_special_tokens", "suffix")
CHAT_ONLY = ("messages", "logprobs", "top_logprobs", "echo", "add_generation_prompt", "continue_final_message",
             "add_special_tokens", *TOOL_FIELDS)
COMPLETION = GENERATION + COMPLETION_ONLY
CHAT = GENERATION + CHAT_ONLY
TOKENIZE = ("model", "prompt", "messages", "add_special_tokens", "add_generation_prompt", "continue_final_message",
            "tools", "return_token_strs")
DETOKENIZE = ("model", "tokens")


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


def declared(body: dict, fields: tuple[str, ...]) -> DeclaredBody:
    return DeclaredBody(body, fields)
