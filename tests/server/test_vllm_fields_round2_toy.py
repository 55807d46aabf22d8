"""vLLM fields that used to be accepted and ignored, against the real server process over the toy model:
the keys a completion choice always carries, /tokenize's token_strs, return_tokens_as_token_ids,
allowed_token_ids, logprob_token_ids, truncate_prompt_tokens / truncation_side, kv_transfer_params,
--max-logprobs with logprobs -1, and the routes llama.cpp and SageMaker clients call.

The toy tokenizer maps a character c to the id 1 + ord(c) % 60 and an id i back to chr(ord("a") + i % 26)."""
import json

import pytest
from tests.server.field_checks import ok, post, refused

httpx = pytest.importorskip("httpx")  # the test extra: a bare GPU host need not have it

MESSAGES = [{"role": "user", "content": "hi"}]


def ids_of(text: str) -> list[int]:
    return [1 + ord(c) % 60 for c in text]








def chunks(server, path: str, body: dict) -> list[dict]:
    r = post(server, path, {**body, "stream": True})
    assert r.status_code == 200, r.text
    return [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]


def test_completion_choices_always_carry_the_prompt_and_token_id_keys(toy_server):
    choice = ok(toy_server, "/v1/completions", {"prompt": "abc", "max_tokens": 2})["choices"][0]
    assert choice["prompt_logprobs"] is None and choice["prompt_token_ids"] is None and choice["token_ids"] is None
    asked = ok(toy_server, "/v1/completions", {"prompt": "abc", "max_tokens": 2, "prompt_logprobs": 1,
                                               "return_token_ids": True})["choices"][0]
    assert asked["prompt_token_ids"] == ids_of("abc") and len(asked["prompt_logprobs"]) == 3
    first = chunks(toy_server, "/v1/completions", {"prompt": "abc", "max_tokens": 2})[0]["choices"][0]
    assert first["prompt_token_ids"] is None and first["token_ids"] is None


def test_tokenize_returns_token_strs_when_asked_and_tokenizer_info(toy_server):
    plain = ok(toy_server, "/tokenize", {"prompt": "abc"})
    assert plain["tokens"] == ids_of("abc") and plain["token_strs"] is None
    asked = ok(toy_server, "/tokenize", {"prompt": "abc", "return_token_strs": True})
    assert asked["token_strs"] == [chr(ord("a") + i % 26) for i in ids_of("abc")]
    chat = ok(toy_server, "/tokenize", {"messages": MESSAGES, "return_token_strs": True})
    assert len(chat["token_strs"]) == chat["count"]
    refused(toy_server, "/tokenize", {"prompt": "abc", "return_token_strs": "yes"}, "return_token_strs")
    info = httpx.get(toy_server.url + "/tokenizer_info", timeout=10).json()
    assert info["tokenizer_class"] == "ChatToyTokenizer"


def test_return_tokens_as_token_ids_names_logprob_tokens_by_id(toy_server):
    body = {"prompt": "abc", "max_tokens": 4, "logprobs": 2, "return_tokens_as_token_ids": True,
            "return_token_ids": True, "ignore_eos": True, "temperature": 0}
    choice = ok(toy_server, "/v1/completions", body)["choices"][0]
    assert choice["logprobs"]["tokens"] == [f"token_id:{t}" for t in choice["token_ids"]]
    assert all(key.startswith("token_id:") for top in choice["logprobs"]["top_logprobs"] for key in top)
    streamed = [t for c in chunks(toy_server, "/v1/completions", body) if c["choices"][0]["logprobs"]
                for t in c["choices"][0]["logprobs"]["tokens"]]
    assert streamed == choice["logprobs"]["tokens"]
    chat = ok(toy_server, "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 3, "logprobs": True,
                                                   "top_logprobs": 2, "return_tokens_as_token_ids": True,
                                                   "return_token_ids": True, "ignore_eos": True})["choices"][0]
    content = chat["logprobs"]["content"]
    assert [c["token"] for c in content] == [f"token_id:{t}" for t in chat["token_ids"]]
    assert all(t["token"].startswith("token_id:") for c in content for t in c["top_logprobs"])
    plain = ok(toy_server, "/v1/completions", {**body, "return_tokens_as_token_ids": False})["choices"][0]
    assert not any(t.startswith("token_id:") for t in plain["logprobs"]["tokens"])


def test_allowed_token_ids_restrict_sampling(toy_server):
    for path, base in (("/v1/completions", {"prompt": "abc"}), ("/v1/chat/completions", {"messages": MESSAGES})):
        out = ok(toy_server, path, {**base, "max_tokens": 5, "temperature": 1.0, "seed": 3, "ignore_eos": True,
                                    "allowed_token_ids": [42], "return_token_ids": True})
        assert out["choices"][0]["token_ids"] == [42] * 5
        two = ok(toy_server, path, {**base, "max_tokens": 12, "temperature": 1.0, "seed": 3, "ignore_eos": True,
                                    "allowed_token_ids": [7, 9], "return_token_ids": True})
        assert set(two["choices"][0]["token_ids"]) <= {7, 9}
    for bad in ([64], [], [-1], "42", [1.5]):
        refused(toy_server, "/v1/completions", {"prompt": "a", "allowed_token_ids": bad}, "allowed_token_ids")


def test_logprob_token_ids_return_the_logprobs_of_the_pinned_ids(toy_server):
    pinned = {"logprob_token_ids": [3, 50], "return_tokens_as_token_ids": True, "ignore_eos": True,
              "return_token_ids": True}
    choice = ok(toy_server, "/v1/completions", {"prompt": "abc", "max_tokens": 3, "logprobs": 5,
                                                **pinned})["choices"][0]
    for chosen, top in zip(choice["token_ids"], choice["logprobs"]["top_logprobs"]):
        assert set(top) == {"token_id:3", "token_id:50", f"token_id:{chosen}"}     # no top 5: the pinned ids
        assert all(v <= 0 for v in top.values())
    chat = ok(toy_server, "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 3, "logprobs": True,
                                                   **pinned})["choices"][0]
    for entry in chat["logprobs"]["content"]:       # the sampled token first (vLLM's peer suite asks it), then the ids
        tokens = [t["token"] for t in entry["top_logprobs"]]
        assert set(tokens) == {"token_id:3", "token_id:50", entry["token"]}
        assert tokens[0] == entry["token"] or entry["token"] in ("token_id:3", "token_id:50")
        assert len(tokens) == len(set(tokens))
    refused(toy_server, "/v1/completions", {"prompt": "a", "logprob_token_ids": [3]}, "logprob_token_ids")
    refused(toy_server, "/v1/chat/completions", {"messages": MESSAGES, "logprob_token_ids": [3]}, "logprob_token_ids")
    refused(toy_server, "/v1/completions", {"prompt": "a", "logprobs": 1, "logprob_token_ids": [64]},
            "logprob_token_ids")
    refused(toy_server, "/v1/completions", {"prompt": "a", "logprobs": 1, "logprob_token_ids": list(range(129))},
            "logprob_token_ids")


def test_truncate_prompt_tokens_keeps_the_last_tokens_or_the_first(toy_server):
    base = {"prompt": "abcdefgh", "max_tokens": 2, "return_token_ids": True}
    kept = ok(toy_server, "/v1/completions", {**base, "truncate_prompt_tokens": 3})["choices"][0]
    assert kept["prompt_token_ids"] == ids_of("fgh")
    first = ok(toy_server, "/v1/completions", {**base, "truncate_prompt_tokens": 3, "truncation_side": "right"})
    assert first["choices"][0]["prompt_token_ids"] == ids_of("abc") and first["usage"]["prompt_tokens"] == 3
    whole = ok(toy_server, "/v1/completions", {**base, "truncate_prompt_tokens": 20})["choices"][0]
    assert whole["prompt_token_ids"] == ids_of("abcdefgh")
    long_prompt = "abcdefghij" * 30                          # 300 tokens; max_model_len is 256
    fits = ok(toy_server, "/v1/completions", {**base, "prompt": long_prompt, "max_tokens": 6,
                                              "truncate_prompt_tokens": -1})["choices"][0]
    assert fits["prompt_token_ids"] == ids_of(long_prompt)[-250:]
    echoed = ok(toy_server, "/v1/completions", {**base, "truncate_prompt_tokens": 3, "echo": True, "max_tokens": 1})
    assert echoed["choices"][0]["text"].startswith("".join(chr(ord("a") + i % 26) for i in ids_of("fgh")))
    chat = ok(toy_server, "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 2, "return_token_ids": True,
                                                   "truncate_prompt_tokens": 2})
    assert chat["prompt_token_ids"] == ids_of("<user>hi<assistant>")[-2:]
    for bad in (0, -2, "3", 1.5, True):
        refused(toy_server, "/v1/completions", {**base, "truncate_prompt_tokens": bad}, "truncate_prompt_tokens")
    message = refused(toy_server, "/v1/completions", {**base, "truncate_prompt_tokens": 255}, "truncate_prompt_tokens")
    assert "254" in message
    refused(toy_server, "/v1/completions", {**base, "truncation_side": "middle"}, "truncation_side")


def test_kv_transfer_params_are_refused(toy_server):
    for value in ({"do_remote_decode": True}, {"prompt_token_ids": [1, 2]}, {}):
        for path, base in (("/v1/completions", {"prompt": "a"}), ("/v1/chat/completions", {"messages": MESSAGES})):
            refused(toy_server, path, {**base, "max_tokens": 1, "kv_transfer_params": value}, "kv_transfer_params")
    ok(toy_server, "/v1/completions", {"prompt": "a", "max_tokens": 1, "kv_transfer_params": None})


def test_routes_without_v1_invocations_and_tokenizer_info(toy_server):
    assert ok(toy_server, "/completions", {"prompt": "abc", "max_tokens": 2})["object"] == "text_completion"
    assert ok(toy_server, "/chat/completions", {"messages": MESSAGES, "max_tokens": 2})["object"] == "chat.completion"
    models = httpx.get(toy_server.url + "/models", timeout=10)
    assert models.status_code == 200 and models.json()["data"][0]["id"] == "toy"
    assert httpx.get(toy_server.url + "/models/toy", timeout=10).json()["id"] == "toy"
    assert ok(toy_server, "/invocations", {"messages": MESSAGES, "max_tokens": 2})["object"] == "chat.completion"
    assert ok(toy_server, "/invocations", {"prompt": "abc", "max_tokens": 2})["object"] == "text_completion"
    streamed = chunks(toy_server, "/invocations", {"prompt": "abc", "max_tokens": 2})
    assert streamed and streamed[0]["object"] == "text_completion"
    refused(toy_server, "/invocations", {"max_tokens": 2}, "messages")


def test_max_logprobs_bounds_requests_and_minus_one_asks_for_the_whole_vocabulary(toy_server, start_toy_server):
    message = refused(toy_server, "/v1/completions", {"prompt": "a", "max_tokens": 1, "logprobs": -1}, "logprobs")
    assert "--max-logprobs" in message
    refused(toy_server, "/v1/completions", {"prompt": "a", "max_tokens": 1, "prompt_logprobs": -1}, "prompt_logprobs")
    refused(toy_server, "/v1/chat/completions", {"messages": MESSAGES, "logprobs": True, "top_logprobs": -1},
            "top_logprobs")
    assert "--max-logprobs" in refused(toy_server, "/v1/completions", {"prompt": "a", "logprobs": 21}, "logprobs")
    wide = start_toy_server("--max-logprobs", "64")
    choice = ok(wide, "/v1/completions", {"prompt": "abc", "max_tokens": 2, "logprobs": -1,
                                          "return_tokens_as_token_ids": True})["choices"][0]
    assert [len(top) for top in choice["logprobs"]["top_logprobs"]] == [64, 64]
    chat = ok(wide, "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 1, "logprobs": True,
                                             "top_logprobs": -1})["choices"][0]
    assert len(chat["logprobs"]["content"][0]["top_logprobs"]) == 64
    assert len(ok(wide, "/v1/completions", {"prompt": "abc", "max_tokens": 1, "prompt_logprobs": -1})
               ["choices"][0]["prompt_logprobs"][1]) == 64
    refused(wide, "/v1/completions", {"prompt": "a", "logprobs": 65}, "logprobs")


def test_tokenize_and_detokenize_check_model_and_tools(toy_server):
    for path, body in (("/tokenize", {"prompt": "abc"}), ("/detokenize", {"tokens": [5]})):
        r = post(toy_server, path, {**body, "model": "no-such-model"})
        assert r.status_code == 404 and r.json()["error"]["param"] == "model", r.text
    refused(toy_server, "/tokenize", {"messages": MESSAGES, "tools": {"type": "function"}}, "tools")
    plain = ok(toy_server, "/tokenize", {"messages": MESSAGES})["tokens"]
    tools = [{"type": "function", "function": {"name": "f"}}]
    assert ok(toy_server, "/tokenize", {"messages": MESSAGES, "tools": tools})["tokens"] == plain  # the toy ignores tools
