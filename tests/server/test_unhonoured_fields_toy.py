"""No field silently ignored (issue 30's rule): the vLLM and OpenAI fields gh200rt now honours (cache_salt,
request_id, bad_words, chat_template / chat_template_kwargs, priority 0, ...), a 400 naming every known field it
cannot honour, and a 400 for a field in no list at all. Parsing first (no server), then the real server over the
toy model, whose tokenizer maps a character c to the id 1 + ord(c) % 60."""
import json

import pytest

from gh200rt.serve import fields
from gh200rt.serve.chat_request import parse_chat_request
from gh200rt.serve.errors import APIError
from gh200rt.serve.protocol import parse_completion_request
from gh200rt.tokenizer.tokenizer import Tokenizer
from tests.server.field_checks import ok, post, refused, refused_param

MESSAGES = [{"role": "user", "content": "hi"}]

# Each refused field with a value that asks for something gh200rt cannot do.
ASKING = {
    "use_beam_search": True, "length_penalty": 0.5, "lora_request": {"lora_name": "a"}, "lora_name": "a",
    "multi_modal_data": {"image": "x"}, "mm_processor_kwargs": {"a": 1}, "media_io_kwargs": {"image": {}},
    "audio": {"voice": "alloy"}, "modalities": ["text", "audio"], "logits_processors": ["x.y"],
    "guided_decoding_backend": "xgrammar", "guided_whitespace_pattern": " *", "watermarking": True,
    "repetition_detection": {"max_pattern_size": 4}, "thinking_token_budget": 10, "vllm_xargs": {"a": 1},
    "routed_experts_prompt_start": 2, "return_token_offsets": True, "return_mm_kwargs": False, "session_id": "s",
    "stream_interval": 4, "store": True, "service_tier": "flex", "prediction": {"type": "content", "content": "x"},
    "prompt_cache_key": "k", "cache_prompt": False, "priority": 1, "spaces_between_special_tokens": False, "kv_transfer_params": {},
    "ec_transfer_params": {},
}
CHAT_ASKING = {
    "documents": [{"title": "t", "text": "x"}], "reasoning_effort": "low", "include_reasoning": False,
    "return_prompt_text": True, "web_search_options": {}, "functions": [{"name": "f"}], "function_call": "auto",
    "verbosity": "low",
}
COMPLETION_ASKING = {"prompt_embeds": "AAAA"}
# Refused fields given the value that asks for nothing: accepted.
ASKING_NOTHING = {
    "use_beam_search": False, "length_penalty": 1, "priority": 0, "spaces_between_special_tokens": True,
    "store": False, "service_tier": "auto", "modalities": ["text"], "stream_interval": 1, "return_mm_kwargs": True,
    "routed_experts_prompt_start": 0, "logits_processors": [], "vllm_xargs": None, "cache_prompt": True,
}


def test_every_refused_field_has_a_case():
    assert set(ASKING) == set(fields.REFUSED)
    assert set(CHAT_ASKING) == set(fields.CHAT_REFUSED) and set(COMPLETION_ASKING) == set(fields.COMPLETION_REFUSED)




def chat(body):
    return parse_chat_request(body)


@pytest.mark.parametrize("name", sorted(ASKING))
def test_refused_fields_are_400_on_both_routes(name):
    assert refused_param(parse_completion_request, {"prompt": "x", name: ASKING[name]}) == name
    assert refused_param(chat, {"messages": MESSAGES, name: ASKING[name]}) == name


@pytest.mark.parametrize("name", sorted(CHAT_ASKING))
def test_refused_chat_fields_are_400(name):
    assert refused_param(chat, {"messages": MESSAGES, name: CHAT_ASKING[name]}) == name
    assert refused_param(parse_completion_request, {"prompt": "x", name: CHAT_ASKING[name]}) == name   # unknown


def test_refused_completion_fields_are_400():
    assert refused_param(parse_completion_request, {"prompt": "x", "prompt_embeds": "AAAA"}) == "prompt_embeds"


def test_values_that_ask_for_nothing_are_accepted():
    parse_completion_request({"prompt": "x", **ASKING_NOTHING})
    parse_chat_request({"messages": MESSAGES, **ASKING_NOTHING, "include_reasoning": True, "documents": [],
                        "metadata": {"team": "a"}, "safety_identifier": "h1", "user": "u"})


@pytest.mark.parametrize("body", [{"bench_extra": 1}, {"temperatur": 0.5}, {"guided_json_schema": {}}])
def test_unknown_fields_are_400(body):
    for parse, base in ((parse_completion_request, {"prompt": "x"}), (chat, {"messages": MESSAGES})):
        with pytest.raises(APIError) as e:
            parse({**base, **body})
        name = next(iter(body))
        assert e.value.status == 400 and e.value.param == name
        assert f"unknown field {name!r}" in e.value.body()["error"]["message"]


@pytest.mark.parametrize("name,value", [
    ("cache_salt", ""), ("cache_salt", 7), ("cache_salt", "s" * 1025), ("request_id", "has space"),
    ("request_id", ""), ("request_id", 5), ("bad_words", "word"), ("bad_words", [" "]), ("bad_words", [3]),
    ("metadata", {"a": 1}), ("metadata", {str(i): "v" for i in range(17)}), ("safety_identifier", 3),
])
def test_bad_values_of_honoured_fields_are_400(name, value):
    assert refused_param(parse_completion_request, {"prompt": "x", name: value}) == name


@pytest.mark.parametrize("kwargs", [[1], "x", {"add_generation_prompt": False}, {"messages": []},
                                    {"chat_template": "x"}, {"tools": []}])
def test_bad_chat_template_kwargs_are_400(kwargs):
    assert refused_param(chat, {"messages": MESSAGES, "chat_template_kwargs": kwargs}) == "chat_template_kwargs"
    assert refused_param(chat, {"messages": MESSAGES, "chat_template": 5}) == "chat_template"


def test_honoured_fields_are_parsed():
    p = parse_completion_request({"prompt": "x", "cache_salt": "salt", "request_id": "r-1", "bad_words": ["no"]})
    assert (p.cache_salt, p.request_id, p.params.bad_words) == ("salt", "r-1", ["no"])
    c, _ = parse_chat_request({"messages": MESSAGES, "chat_template": "{{ x }}",
                               "chat_template_kwargs": {"enable_thinking": False}})
    assert c.extra["template_options"] == {"chat_template": "{{ x }}", "template_kwargs": {"enable_thinking": False}}


QWEN3_LIKE = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
              "{% if add_generation_prompt %}<|im_start|>assistant\n"
              "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}"
              "{% endif %}")


def test_chat_template_kwargs_reach_the_template():
    """Qwen3's switch: enable_thinking false writes an empty think block after the generation prompt."""
    tok = Tokenizer(None, chat_template=QWEN3_LIKE)
    plain = tok.apply_chat_template(MESSAGES, add_generation_prompt=True)
    off = tok.apply_chat_template(MESSAGES, add_generation_prompt=True, enable_thinking=False)
    assert plain == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert off == plain + "<think>\n\n</think>\n\n"
    own = tok.apply_chat_template(MESSAGES, add_generation_prompt=False, chat_template="{{ messages[0].content }}!")
    assert own == "hi!"


# ---- the real server over the toy model --------------------------------------------------------------------------

httpx = pytest.importorskip("httpx")  # the test extra: a bare GPU host need not have it


def ids_of(text: str) -> list[int]:
    return [1 + ord(c) % 60 for c in text]


def char_of(token: int) -> str:
    """A one-character word the toy tokenizer encodes to ``token`` (1..60)."""
    assert 1 <= token <= 60
    return chr(token - 1 + 60)








@pytest.mark.parametrize("path,body", [
    ("/v1/completions", {"prompt": "abc"}), ("/v1/chat/completions", {"messages": MESSAGES}),
    ("/tokenize", {"prompt": "abc"}), ("/tokenize", {"messages": MESSAGES}), ("/detokenize", {"tokens": [1]}),
])
def test_server_refuses_unknown_fields(toy_server, path, body):
    message = refused(toy_server, path, {**body, "bench_extra": 1}, "bench_extra")
    assert "unknown field 'bench_extra'" in message and "README" in message
    ok(toy_server, path, body)


@pytest.mark.parametrize("name", ["priority", "spaces_between_special_tokens", "logits_processors", "store",
                                  "length_penalty", "vllm_xargs", "kv_transfer_params"])
def test_server_refuses_unhonoured_fields(toy_server, name):
    for path, base in (("/v1/completions", {"prompt": "abc"}), ("/v1/chat/completions", {"messages": MESSAGES})):
        refused(toy_server, path, {**base, "max_tokens": 2, name: ASKING[name]}, name)
    ok(toy_server, "/v1/completions", {"prompt": "abc", "max_tokens": 2, **ASKING_NOTHING})
    refused(toy_server, "/v1/chat/completions", {"messages": MESSAGES, "reasoning_effort": "high"}, "reasoning_effort")
    refused(toy_server, "/tokenize", {"messages": MESSAGES, "mm_processor_kwargs": {"a": 1}}, "mm_processor_kwargs")


def cached(server, prompt: str, **body) -> int:
    usage = ok(server, "/v1/completions", {"prompt": prompt, "max_tokens": 1, **body})["usage"]
    return usage["prompt_tokens_details"]["cached_tokens"]


def test_cache_salt_keeps_prefix_caches_apart(toy_server):
    prompt = "cache salt keeps these apart"        # 28 tokens: 6 full blocks of 4 can be reused
    assert cached(toy_server, prompt, cache_salt="tenant-a") == 0
    assert cached(toy_server, prompt, cache_salt="tenant-a") > 0           # the same salt shares
    assert cached(toy_server, prompt, cache_salt="tenant-b") == 0          # another salt does not
    assert cached(toy_server, prompt) == 0                                # nor does no salt
    assert cached(toy_server, prompt) > 0
    chat = {"messages": [{"role": "user", "content": prompt}], "max_tokens": 1, "cache_salt": "tenant-c"}
    assert ok(toy_server, "/v1/chat/completions", chat)["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert ok(toy_server, "/v1/chat/completions", chat)["usage"]["prompt_tokens_details"]["cached_tokens"] > 0


def test_request_id_names_the_response(toy_server):
    r = post(toy_server, "/v1/completions", {"prompt": "abc", "max_tokens": 2, "request_id": "trace-7"})
    assert r.status_code == 200 and r.json()["id"] == "cmpl-trace-7" and r.headers["x-request-id"] == "trace-7"
    r = post(toy_server, "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 2, "request_id": "trace-8",
                                                  "stream": True})
    ids = {json.loads(line[6:])["id"] for line in r.text.splitlines() if line.startswith("data: {")}
    assert ids == {"chatcmpl-trace-8"} and r.headers["x-request-id"] == "trace-8"
    plain = post(toy_server, "/v1/completions", {"prompt": "abc", "max_tokens": 2})
    assert plain.json()["id"].startswith("cmpl-") and "x-request-id" not in plain.headers


def greedy(server, **body) -> dict:
    return ok(server, "/v1/completions", {"prompt": "bad words", "max_tokens": 12, "temperature": 0,
                                          "ignore_eos": True, "return_token_ids": True, **body})["choices"][0]


def test_bad_words_ban_one_token_words_everywhere(toy_server):
    base = greedy(toy_server)["token_ids"]
    target = next(t for t in base if 1 <= t <= 60)
    banned = greedy(toy_server, bad_words=[char_of(target)])["token_ids"]
    assert target not in banned
    # a one-token word is banned at every step: the same tokens as an (effectively infinite) negative bias
    assert banned == greedy(toy_server, logit_bias={str(target): -100})["token_ids"]


def test_bad_words_ban_a_sequence_only_after_its_prefix(toy_server):
    """The word's last token is banned only where the output ends with its other tokens: the output follows the
    unconstrained one up to that point, then takes the runner-up there."""
    base = greedy(toy_server, logprobs=2, return_tokens_as_token_ids=True)
    tokens = base["token_ids"]
    p = next(i for i in range(1, len(tokens)) if 1 <= tokens[i - 1] <= 60 and 1 <= tokens[i] <= 60)
    word = char_of(tokens[p - 1]) + char_of(tokens[p])
    out = greedy(toy_server, bad_words=[word])["token_ids"]
    pairs = list(zip(out, out[1:]))
    assert (tokens[p - 1], tokens[p]) not in pairs
    first = next(i for i in range(1, p + 1) if tokens[i - 1] == tokens[p - 1] and tokens[i] == tokens[p])
    assert out[:first] == tokens[:first]
    ranked = sorted(base["logprobs"]["top_logprobs"][first].items(), key=lambda kv: -kv[1])
    runner_up = int(ranked[1][0].split(":")[1])
    assert out[first] == runner_up != tokens[first]


def test_chat_template_needs_the_trust_flag(toy_server):
    body = {"messages": MESSAGES, "chat_template": "{{ messages[0].content }}", "max_tokens": 2}
    assert "--trust-request-chat-template" in refused(toy_server, "/v1/chat/completions", body, "chat_template")
    refused(toy_server, "/tokenize", {"messages": MESSAGES, "chat_template": "x"}, "chat_template")
    for name, value in (("chat_template_kwargs", {"a": 1}), ("add_generation_prompt", True), ("tools", [])):
        refused(toy_server, "/tokenize", {"prompt": "x", name: value}, name)     # they shape 'messages' only


def test_chat_template_and_its_kwargs_render_the_prompt(start_toy_server):
    server = start_toy_server("--trust-request-chat-template")
    template = "{% for m in messages %}[{{ greeting }} {{ m.content }}]{% endfor %}"
    body = {"messages": MESSAGES, "chat_template": template, "chat_template_kwargs": {"greeting": "yo"}}
    assert ok(server, "/tokenize", body)["tokens"] == ids_of("[yo hi]")
    answer = ok(server, "/v1/chat/completions", {**body, "max_tokens": 2, "return_token_ids": True})
    assert answer["prompt_token_ids"] == ids_of("[yo hi]")
    other = ok(server, "/tokenize", {**body, "chat_template_kwargs": {"greeting": "hey"}})["tokens"]
    assert other == ids_of("[hey hi]")
    message = refused(server, "/v1/chat/completions", {**body, "chat_template": "{% for %}"}, "chat_template")
    assert "not valid jinja" in message
