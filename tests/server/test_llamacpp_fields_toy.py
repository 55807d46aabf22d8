"""llama.cpp's own request fields on the OpenAI routes: the mapped ones behave as their gh200rt counterparts
(n_predict as max_tokens, repeat_penalty as repetition_penalty, list-form logit_bias as the map, n_probs as chat's
top_logprobs, n_cmpl as n), and the defaults-only ones accept llama.cpp's default and refuse another value with a
400 naming them. Parsing first (no server), then the real server over the toy model."""
import pytest

from gh200rt.serve import llamacpp_fields
from gh200rt.serve.chat_request import parse_chat_request
from gh200rt.serve.errors import APIError
from gh200rt.serve.protocol import parse_completion_request
from tests.server.field_checks import ok, post, refused_param

MESSAGES = [{"role": "user", "content": "hi"}]
LLAMACPP_SAMPLERS = ["penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature"]

# Each defaults-only field: (llama.cpp's default, a value that asks for something).
DEFAULTS = {
    "typical_p": (1.0, 0.9), "tfs_z": (1.0, 0.95), "top_n_sigma": (-1.0, 1.5), "min_keep": (0, 3),
    "dynatemp_range": (0.0, 0.5), "dynatemp_exponent": (1.0, 2.0), "mirostat": (0, 2), "mirostat_tau": (5.0, 3.0),
    "mirostat_eta": (0.1, 0.2), "dry_multiplier": (0.0, 0.8), "dry_base": (1.75, 2.0), "dry_allowed_length": (2, 4),
    "dry_penalty_last_n": (-1, 32), "dry_sequence_breakers": (["\n", ":", "\"", "*"], ["."]),
    "xtc_probability": (0.0, 0.5), "xtc_threshold": (0.1, 0.2), "id_slot": (-1, 0), "n_keep": (0, 8),
    "n_discard": (0, 4), "n_indent": (0, 2), "n_cache_reuse": (0, 256), "t_max_predict_ms": (0, 500),
    "t_max_prompt_ms": (-1, 500), "timings_per_token": (False, True), "return_progress": (False, True),
    "return_tokens": (False, True), "post_sampling_probs": (False, True), "response_fields": ([], ["content"]),
    "lora": ([], [{"id": 0, "scale": 0.5}]), "image_data": ([], [{"data": "AAAA", "id": 1}]),
    "multimodal_data": ([], ["AAAA"]),
}
# What switches a gated field's sampler on, so that the field's own value matters.
SWITCH_ON = {"dynatemp_range": 0.5, "mirostat": 2, "dry_multiplier": 0.8, "xtc_probability": 0.5}


def test_every_defaults_only_field_has_a_case():
    assert set(DEFAULTS) == set(llamacpp_fields.DEFAULTS_ONLY)




def chat(body):
    return parse_chat_request(body)[0]


@pytest.mark.parametrize("name", sorted(DEFAULTS))
def test_defaults_only_fields_take_their_default_and_refuse_another_value(name):
    default, asking = DEFAULTS[name]
    for parse, base in ((parse_completion_request, {"prompt": "x"}), (chat, {"messages": MESSAGES})):
        parse({**base, name: default})
        parse({**base, name: None})
        gate = llamacpp_fields.GATED_BY.get(name)
        body = {**base, name: asking}
        if gate is not None:
            parse(body)                      # its sampler is off: the value changes nothing
            body[gate] = SWITCH_ON[gate]     # on, the switch itself is the 400
            assert refused_param(parse, body) == gate
        else:
            message = e_message(parse, body, name)
            assert name in message


def e_message(parse, body, name) -> str:
    with pytest.raises(APIError) as e:
        parse(body)
    assert e.value.status == 400 and e.value.param == name, e.value.body()
    return e.value.body()["error"]["message"]


def test_n_predict_maps_to_max_tokens():
    assert parse_completion_request({"prompt": "x", "n_predict": 5}).params.max_tokens == 5
    assert parse_completion_request({"prompt": "x", "n_predict": 5, "max_tokens": 5}).params.max_tokens == 5
    assert parse_completion_request({"prompt": "x", "n_predict": -1}).params.max_tokens is None   # to EOS / context
    assert parse_completion_request({"prompt": "x"}).params.max_tokens == 16
    for bad in ({"n_predict": 0}, {"n_predict": -2}, {"n_predict": "5"}, {"n_predict": 3, "max_tokens": 4},
                {"n_predict": -1, "max_completion_tokens": 4}):
        assert refused_param(parse_completion_request, {"prompt": "x", **bad}) == "n_predict"


def test_repeat_penalty_and_its_window():
    def params(**body):
        return parse_completion_request({"prompt": "x", **body}).params
    p = params(repeat_penalty=1.3)
    assert (p.repetition_penalty, p.repetition_window) == (1.3, 64)           # llama.cpp's default window
    assert params(repetition_penalty=1.3).repetition_window is None          # vLLM's: all of it
    assert params(repeat_penalty=1.3, repeat_last_n=-1).repetition_window is None
    assert params(repetition_penalty=1.3, repeat_last_n=8).repetition_window == 8
    assert params(repeat_penalty=1.3, repetition_penalty=1.3).repetition_penalty == 1.3
    for bad in ({"repeat_penalty": 1.2, "repetition_penalty": 1.3}, {"repeat_penalty": 0},
                {"repeat_penalty": "x"}):
        assert refused_param(parse_completion_request, {"prompt": "x", **bad}) == "repeat_penalty"
    assert refused_param(parse_completion_request, {"prompt": "x", "repeat_last_n": -2}) == "repeat_last_n"


def test_logit_bias_forms():
    def bias(value):
        return parse_completion_request({"prompt": "x", "logit_bias": value}).params.logit_bias
    assert bias([[5, 2.5], [7, False]]) == {5: 2.5, 7: float("-inf")}
    assert bias({"5": 2.5, "7": False}) == {5: 2.5, 7: float("-inf")}
    for bad in ([["hello", 1]], [[5]], [[5, True]], [[5, 101]], [[-1, 1]], {"5": True}, {"a": 1}, "x"):
        assert refused_param(parse_completion_request, {"prompt": "x", "logit_bias": bad}) == "logit_bias"


def test_n_cmpl_and_n_probs():
    assert parse_completion_request({"prompt": "x", "n_cmpl": 3}).params.n == 3
    assert parse_completion_request({"prompt": "x", "n_cmpl": 3, "n": 3}).params.n == 3
    assert refused_param(parse_completion_request, {"prompt": "x", "n_cmpl": 2, "n": 3}) == "n_cmpl"
    assert refused_param(parse_completion_request, {"prompt": "x", "n_cmpl": 17}) == "n_cmpl"
    c = chat({"messages": MESSAGES, "n_probs": 3})
    assert (c.logprobs, c.params.logprobs, c.logprob_ids) == (3, 3, True)
    assert chat({"messages": MESSAGES, "n_probs": 3, "logprobs": True, "top_logprobs": 3}).logprobs == 3
    assert chat({"messages": MESSAGES, "n_probs": 0}).logprobs is None
    for bad in ({"logprobs": False}, {"logprobs": True, "top_logprobs": 2}):
        assert refused_param(chat, {"messages": MESSAGES, "n_probs": 3, **bad}) == "n_probs"
    parse_completion_request({"prompt": "x", "n_probs": 0})
    assert refused_param(parse_completion_request, {"prompt": "x", "n_probs": 2}) == "n_probs"


@pytest.mark.parametrize("samplers,body,accepted", [
    (llamacpp_fields.SAMPLER_ORDER, {"temperature": 0.5, "top_p": 0.9, "repeat_penalty": 1.1}, True),
    (LLAMACPP_SAMPLERS, {}, True),                                   # nothing the order changes
    (LLAMACPP_SAMPLERS, {"temperature": 1.0, "top_p": 0.9}, True),   # temperature 1 changes nothing either way
    (LLAMACPP_SAMPLERS, {"temperature": 0, "min_p": 0.1}, True),     # greedy
    (LLAMACPP_SAMPLERS, {"temperature": 0.5, "top_k": 5}, True),     # top_k keeps the same tokens at any temperature
    (LLAMACPP_SAMPLERS, {"temperature": 0.5, "top_p": 0.9}, False),  # temperature after top_p: other draws
    (["top_k", "temperature"], {"top_p": 0.9}, False),               # top_p left out, but set
    (["temperature", "penalties"], {"repeat_penalty": 1.1}, True),   # temperature 1: off
    (["top_k", "penalties"], {"top_k": 5, "presence_penalty": 0.5}, False),
    (["mirostat"], {}, False), ("kfypmxt", {}, False),
])
def test_samplers(samplers, body, accepted):
    full = {"prompt": "x", "samplers": samplers, **body}
    if accepted:
        parse_completion_request(full)
    else:
        assert refused_param(parse_completion_request, full) == "samplers"


def test_penalize_nl():
    parse_completion_request({"prompt": "x", "penalize_nl": True, "repeat_penalty": 1.2})
    parse_completion_request({"prompt": "x", "penalize_nl": False})             # no penalty: nothing to exclude
    for penalty in ({"repeat_penalty": 1.2}, {"presence_penalty": 0.5}, {"frequency_penalty": 0.5}):
        assert refused_param(parse_completion_request, {"prompt": "x", "penalize_nl": False, **penalty}) == \
            "penalize_nl"


# ---- the real server over the toy model --------------------------------------------------------------------------

httpx = pytest.importorskip("httpx")  # the test extra: a bare GPU host need not have it






def greedy(server, **body) -> dict:
    return ok(server, "/v1/completions", {"prompt": "llama fields", "temperature": 0, "ignore_eos": True,
                                          "return_token_ids": True, **body})


def test_n_predict_limits_the_tokens(toy_server):
    three = greedy(toy_server, n_predict=3)
    assert three["usage"]["completion_tokens"] == 3 and three["choices"][0]["finish_reason"] == "length"
    assert three["choices"][0]["token_ids"] == greedy(toy_server, max_tokens=3)["choices"][0]["token_ids"]
    whole = greedy(toy_server, n_predict=-1)           # until the context (256) is full
    assert whole["usage"]["prompt_tokens"] + whole["usage"]["completion_tokens"] == 256
    chat = ok(toy_server, "/v1/chat/completions", {"messages": MESSAGES, "n_predict": 2, "ignore_eos": True})
    assert chat["usage"]["completion_tokens"] == 2


def test_repeat_penalty_equals_repetition_penalty(toy_server):
    """Prompt and output within llama.cpp's default window of 64: the same tokens; past it, the window counts."""
    def ids(**body):
        return greedy(toy_server, max_tokens=24, **body)["choices"][0]["token_ids"]
    plain, vllm = ids(), ids(repetition_penalty=2.0)
    assert vllm != plain                                        # the penalty changes something on this toy
    assert ids(repeat_penalty=2.0) == vllm
    assert ids(repeat_penalty=2.0, repeat_last_n=-1) == vllm
    assert ids(repeat_penalty=2.0, repeat_last_n=0) == plain    # 0: no token is penalised
    assert ids(repetition_penalty=2.0, repeat_last_n=1) != vllm  # only the last token: another answer


def test_list_logit_bias_equals_the_map(toy_server):
    def ids(bias):
        return greedy(toy_server, max_tokens=8, logit_bias=bias)["choices"][0]["token_ids"]
    target = ids(None)[0]
    assert ids([[target, -50]]) == ids({str(target): -50}) != ids(None)
    banned = ids([[target, False]])
    assert target not in banned and banned == ids({str(target): False}) == ids({str(target): -100})


def test_n_probs_on_chat_and_completions(toy_server):
    body = {"messages": MESSAGES, "max_tokens": 3, "temperature": 0, "ignore_eos": True}
    llama = ok(toy_server, "/v1/chat/completions", {**body, "n_probs": 2})["choices"][0]["logprobs"]["content"]
    openai = ok(toy_server, "/v1/chat/completions", {**body, "logprobs": True, "top_logprobs": 2})
    openai = openai["choices"][0]["logprobs"]["content"]
    assert len(llama) == 3 and all(len(e["top_logprobs"]) == 2 for e in llama)
    assert all(isinstance(e["id"], int) and all("id" in t for t in e["top_logprobs"]) for e in llama)
    strip = [{k: v for k, v in e.items() if k != "id"} | {"top_logprobs": [{k: v for k, v in t.items() if k != "id"}
                                                                           for t in e["top_logprobs"]]}
             for e in llama]
    assert strip == openai
    r = post(toy_server, "/v1/completions", {"prompt": "abc", "max_tokens": 2, "n_probs": 2})
    assert r.status_code == 400 and r.json()["error"]["param"] == "n_probs"


def test_n_cmpl_gives_that_many_choices(toy_server):
    assert len(greedy(toy_server, max_tokens=2, n_cmpl=3)["choices"]) == 3


@pytest.mark.parametrize("path", ["/v1/completions", "/completions", "/v1/chat/completions", "/chat/completions"])
def test_a_llamacpp_client_body_is_served(toy_server, path):
    """What llama.cpp's own clients send at the defaults is accepted on every OpenAI route; one field off its
    default is a 400 naming it."""
    body = {"n_predict": 2, "temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05, "typical_p": 1.0,
            "repeat_penalty": 1.0, "repeat_last_n": 64, "mirostat": 0, "mirostat_tau": 5.0, "mirostat_eta": 0.1,
            "dry_multiplier": 0.0, "dry_base": 1.75, "xtc_probability": 0.0, "xtc_threshold": 0.1, "id_slot": -1,
            "cache_prompt": True, "n_probs": 0, "timings_per_token": False,
            "post_sampling_probs": False, "return_tokens": False, "n_keep": 0, "t_max_predict_ms": 0}
    base = {"messages": MESSAGES} if "chat" in path else {"prompt": "abc"}
    ok(toy_server, path, {**base, **body})
    r = post(toy_server, path, {**base, **body, "mirostat": 2})
    assert r.status_code == 400 and r.json()["error"]["param"] == "mirostat", r.text
