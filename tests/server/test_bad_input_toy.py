"""No user input produces a 5xx or disturbs other requests (real server process, toy model).

First a table of malformed bodies, each with the field the 400 must name; then a seeded fuzz
pass that mutates valid requests with garbage of every JSON kind while a well-formed stream runs
alongside and must finish exactly as asked.
"""
import asyncio
import json
import random

import pytest

httpx = pytest.importorskip("httpx")  # the test extra: a bare GPU host need not have it

from tests.server.helpers import ServerProcess, settled_metrics  # noqa: E402

C, CH, TOK, DETOK = "/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize"
BIG = 10**400
MSG = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def server():
    s = ServerProcess("tests.server.toy_server", ["--model", "toy", "--num-kv-blocks", "256", "--block-size", "4",
                                                  "--max-model-len", "64", "--max-request-bytes", "200000"])
    yield s
    s.stop()


def completion(**fields):
    return {"prompt": "hi", "max_tokens": 3, **fields}


def chat(**fields):
    return {"messages": MSG, "max_tokens": 3, **fields}


# (path, body: dict or raw bytes, the param the error names (None: the body as a whole, or the prompt and
# max_tokens together, beyond max_model_len), status)
CASES = [
    (C, b"", None, 400), (C, b"{", None, 400), (C, b"[1, 2]", None, 400), (C, b"null", None, 400),
    (C, b'"prompt"', None, 400), (C, b"\xff\xfe\x00", None, 400), (C, b"\xef\xbb\xbf{}", None, 400),
    (C, b'{"prompt": "a", "temperature": NaN}', None, 400), (C, b'{"prompt": "a", "top_p": Infinity}', None, 400),
    (C, b'{"prompt": "a", "top_p": -1e999}', None, 400), (C, b"[" * 50000 + b"]" * 50000, None, 400),
    (C, b'{"prompt": 1' + b"0" * 5000 + b"}", None, 400),
    (C, b'{"prompt": "\\ud800 unpaired"}', "prompt", 400), (C, b'{"prompt": ["ok", "\\udfff"]}', "prompt", 400),
    (CH, b'{"messages": [{"role": "user", "content": "\\ud83d"}]}', "messages", 400),
    (C, b'{"prompt": "a", "model": "\\udc00"}', "model", 400), (TOK, b'{"prompt": "\\ud800"}', "prompt", 400),
    (C, {"max_tokens": 3}, "prompt", 400), (C, completion(prompt=None), "prompt", 400),
    (C, completion(prompt=""), "prompt", 400), (C, completion(prompt=[]), "prompt", 400),
    (C, completion(prompt=[[]]), "prompt", 400), (C, completion(prompt=[[1, [2]]]), "prompt", 400),
    (C, completion(prompt=[-1]), "prompt", 400), (C, completion(prompt=[64]), "prompt", 400),
    (C, completion(prompt=[BIG]), "prompt", 400), (C, completion(prompt=[2**63]), "prompt", 400),
    (C, completion(prompt=[True]), "prompt", 400), (C, completion(prompt=[1.0]), "prompt", 400),
    (C, completion(prompt={"text": "a"}), "prompt", 400), (C, completion(prompt=["a", [1]]), "prompt", 400),
    (C, completion(prompt=["a"] * 600), "prompt", 400), (C, completion(prompt="x" * 70), None, 400),
    (C, completion(max_tokens=63), None, 400), (C, completion(max_tokens=BIG), "max_tokens", 400),
    (C, completion(max_tokens=0), "max_tokens", 400), (C, completion(max_tokens=-5), "max_tokens", 400),
    (C, completion(max_tokens="5"), "max_tokens", 400), (C, completion(max_tokens=2.5), "max_tokens", 400),
    (C, completion(max_tokens=True), "max_tokens", 400), (C, completion(max_completion_tokens=0),
                                                             "max_completion_tokens", 400),
    (C, completion(temperature=-0.1), "temperature", 400), (C, completion(temperature=BIG), "temperature", 400),
    (C, completion(temperature="hot"), "temperature", 400), (C, completion(temperature=[1]), "temperature", 400),
    (C, completion(top_p=0), "top_p", 400), (C, completion(top_p=BIG), "top_p", 400),
    (C, completion(top_p=1.5), "top_p", 400), (C, completion(top_k=-2), "top_k", 400),
    (C, completion(top_k=1.5), "top_k", 400), (C, completion(min_p=BIG), "min_p", 400),
    (C, completion(min_p=-1), "min_p", 400), (C, completion(repetition_penalty=0), "repetition_penalty", 400),
    (C, completion(repetition_penalty=BIG), "repetition_penalty", 400),
    (C, completion(presence_penalty=BIG), "presence_penalty", 400),
    (C, completion(frequency_penalty=-BIG), "frequency_penalty", 400),
    (C, completion(frequency_penalty=2**60), "frequency_penalty", 400),
    (C, completion(n=0), "n", 400), (C, completion(n=17), "n", 400), (C, completion(n=BIG), "n", 400),
    (C, completion(n=1.0), "n", 400), (C, completion(seed=2**64), "seed", 400),
    (C, completion(seed=-(2**63) - 1), "seed", 400), (C, completion(seed=BIG), "seed", 400),
    (C, completion(seed="1"), "seed", 400), (C, completion(logprobs=21), "logprobs", 400),
    (C, completion(logprobs=-1), "logprobs", 400), (C, completion(logprobs=True), "logprobs", 400),
    (C, completion(stop=[1]), "stop", 400), (C, completion(stop=[None]), "stop", 400),
    (C, completion(stop=""), "stop", 400), (C, completion(stop={"a": 1}), "stop", 400),
    (C, completion(stop=[[]]), "stop", 400), (C, completion(stop_token_ids=[-1]), "stop_token_ids", 400),
    (C, completion(stop_token_ids=[64]), "stop_token_ids", 400),
    (C, completion(stop_token_ids=[BIG], min_tokens=2), "stop_token_ids", 400),
    (C, completion(stop_token_ids="1"), "stop_token_ids", 400), (C, completion(stop_token_ids=[True]),
                                                                  "stop_token_ids", 400),
    (C, completion(min_tokens=-1), "min_tokens", 400), (C, completion(min_tokens=4), "min_tokens", 400),
    (C, completion(echo=1), "echo", 400), (C, completion(stream="yes"), "stream", 400),
    (C, completion(ignore_eos="no"), "ignore_eos", 400),
    (C, completion(stream_options={"include_usage": True}), "stream_options", 400),
    (C, completion(stream=True, stream_options="x"), "stream_options", 400),
    (C, completion(stream=True, stream_options={"include_usage": 1}), "include_usage", 400),
    (C, completion(model=[1]), "model", 400), (C, completion(model={}), "model", 400),
    (C, completion(model=5), "model", 400), (C, completion(model="gpt-4"), "model", 404),
    (C, completion(logit_bias={"5": 101}), "logit_bias", 400),
    (C, completion(logit_bias={"x": 1}), "logit_bias", 400), (C, completion(logit_bias=[1]), "logit_bias", 400),
    (C, completion(logit_bias={"64": 1}), None, 400), (C, completion(use_beam_search=True), "use_beam_search", 400),
    (C, completion(best_of=3), "best_of", 400), (CH, chat(lora_request={"name": "a"}), "lora_request", 400), (C, completion(suffix="end"), "suffix", 400),
    (C, completion(response_format={"type": "xml"}), "response_format", 400),
    (C, completion(response_format={"type": "json_object"}), None, 400),      # the toy tokenizer has no vocabulary
    (CH, {"max_tokens": 3}, "messages", 400), (CH, chat(messages=[]), "messages", 400),
    (CH, chat(messages="hi"), "messages", 400), (CH, chat(messages=[None]), "messages", 400),
    (CH, chat(messages=[{"content": "x"}]), "messages", 400),
    (CH, chat(messages=[{"role": "robot", "content": "x"}]), "messages", 400),
    (CH, chat(messages=[{"role": ["user"], "content": "x"}]), "messages", 400),
    (CH, chat(messages=[{"role": "user", "content": 5}]), "messages", 400),
    (CH, chat(messages=[{"role": "user", "content": {"text": "x"}}]), "messages", 400),
    (CH, chat(messages=[{"role": "user", "content": [{"type": "text"}]}]), "messages", 400),
    (CH, chat(messages=[{"role": "user", "content": [{"type": "text", "text": 1}]}]), "messages", 400),
    (CH, chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]),
     "messages", 400),
    (CH, chat(messages=[{"role": "user", "content": "x" * 70}]), None, 400),
    (CH, chat(logprobs="yes"), "logprobs", 400), (CH, chat(top_logprobs=2), "top_logprobs", 400),
    (CH, chat(logprobs=True, top_logprobs=21), "top_logprobs", 400),
    (CH, chat(logprobs=True, top_logprobs=BIG), "top_logprobs", 400),
    (CH, chat(add_generation_prompt=1), "add_generation_prompt", 400),
    (CH, chat(tools=[{"type": "function", "function": {"name": "f"}}]), "tool_choice", 400),
    (CH, chat(tools=[{"type": "function"}], tool_choice="none"), "tools", 400),
    (CH, chat(n=17), "n", 400), (CH, chat(temperature=float("-0.5")), "temperature", 400),
    (TOK, {}, "prompt", 400), (TOK, {"prompt": 5}, "prompt", 400), (TOK, {"messages": 5}, "messages", 400),
    (TOK, {"prompt": "a", "add_special_tokens": "yes"}, "add_special_tokens", 400),
    (TOK, {"messages": MSG, "add_generation_prompt": None}, "add_generation_prompt", 400),
    (DETOK, {}, "tokens", 400), (DETOK, {"tokens": 5}, "tokens", 400), (DETOK, {"tokens": [BIG]}, "tokens", 400),
    (DETOK, {"tokens": [-1]}, "tokens", 400), (DETOK, {"tokens": [None]}, "tokens", 400),
    (DETOK, {"tokens": [[1]]}, "tokens", 400), (DETOK, {"tokens": [64]}, "tokens", 400),
    (C, {"prompt": "x" * 300000}, None, 413),
]


def post(server, path, body, **kw):
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(server.url + path, content=content, timeout=30, **kw)


@pytest.mark.parametrize("path,body,param,status", CASES, ids=[f"{i}-{c[0]}-{c[2]}" for i, c in enumerate(CASES)])
def test_malformed_input_is_a_4xx_naming_the_field(server, path, body, param, status):
    r = post(server, path, body)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["code"] in (status, "model_not_found")
    assert err["message"] and len(err["message"]) < 400, err["message"]
    if param is not None:
        assert err["param"] == param, err


def test_chunked_body_over_the_limit_is_413(server):
    def chunks():
        for _ in range(300):
            yield b"x" * 1000
    r = httpx.post(server.url + C, content=chunks(), timeout=30)     # no Content-Length: read up to the limit
    assert r.status_code == 413 and r.json()["error"]["code"] == 413


@pytest.mark.parametrize("prompt", ["\x00", "😀 emoji", "e\u0301 combining", "\u202e rtl", "\ufeff bom",
                                    "\U0010ffff", "tab\tnew\nline", "\\ud800 escaped, not a surrogate"])
def test_unicode_edge_cases_are_served(server, prompt):
    r = post(server, C, completion(prompt=prompt, echo=True))
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"].startswith(prompt)
    r = post(server, CH, chat(messages=[{"role": "user", "content": prompt}]))
    assert r.status_code == 200, r.text


# ---- seeded fuzz --------------------------------------------------------------------------------
NUMBERS = [0, 1, -1, 2, 3, 4, 16, 17, 20, 21, 63, 64, 256, 0.5, -0.5, 1e-300, 5e-324, 1e308, 2**53 + 1, 2**63 - 1,
           2**63, 2**64, -(2**63) - 1, 10**30, -(10**30)]
STRINGS = ["", "a", "hi there", "\x00", "😀", "\u202e", "e\u0301", "x" * 1000, "null", "[DONE]", "data: x\n\n",
           "user", "assistant", "text", "toy", "<assistant>"]
COMPLETION_FIELDS = ["prompt", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "min_p", "n",
                     "stop", "seed", "logprobs", "echo", "presence_penalty", "frequency_penalty",
                     "repetition_penalty", "stream", "stream_options", "user", "ignore_eos", "min_tokens",
                     "stop_token_ids", "skip_special_tokens", "include_stop_str_in_output", "model", "logit_bias",
                     "response_format", "suffix", "best_of", "cache_salt", "request_id", "bad_words", "priority",
                     "unknown_extra"]
CHAT_FIELDS = [f for f in COMPLETION_FIELDS if f not in ("prompt", "echo", "suffix")] + [
    "messages", "top_logprobs", "add_generation_prompt", "tools", "tool_choice"]


def garbage(rng: random.Random, depth: int = 0):
    kind = rng.choice(["none", "bool", "number", "number", "string", "string", "list", "dict"] if depth < 3
                      else ["none", "bool", "number", "string"])
    if kind == "none":
        return None
    if kind == "bool":
        return rng.random() < 0.5
    if kind == "number":
        return rng.choice(NUMBERS)
    if kind == "string":
        return rng.choice(STRINGS)
    if kind == "list":
        return [garbage(rng, depth + 1) for _ in range(rng.choice([0, 1, 2, 5]))]
    keys = ["role", "content", "type", "text", "include_usage", "x"]
    return {rng.choice(keys): garbage(rng, depth + 1) for _ in range(rng.choice([0, 1, 2, 3]))}


def fuzzed_request(rng: random.Random) -> tuple[str, object]:
    path = rng.choice([C, C, CH, CH, TOK, DETOK])
    base = {C: completion(), CH: chat(), TOK: {"prompt": "hi"}, DETOK: {"tokens": [5, 6]}}[path]
    if rng.random() < 0.05:
        return path, garbage(rng)                                   # not even an object
    fields = {C: COMPLETION_FIELDS, CH: CHAT_FIELDS, TOK: ["prompt", "messages", "add_generation_prompt",
                                                           "add_special_tokens"], DETOK: ["tokens"]}[path]
    body = dict(base)
    for name in rng.sample(fields, min(len(fields), rng.choice([1, 1, 2, 3]))):
        body[name] = garbage(rng)
    if path == CH and rng.random() < 0.3:                           # garbage inside a message
        body["messages"] = [{"role": rng.choice(["user", "system", "tool", "x"]), "content": garbage(rng)}]
    return path, body


async def _check_stream(response: httpx.Response) -> None:
    events = [line async for line in response.aiter_lines() if line.startswith("data: ")]
    assert events and events[-1] == "data: [DONE]", events[-3:]
    for line in events[:-1]:
        assert "error" not in json.loads(line[6:]), line


async def _victim(client: httpx.AsyncClient, stop: asyncio.Event) -> int:
    """Well-formed streams, one after another, until the fuzz ends: each must finish exactly as asked."""
    done = 0
    while not stop.is_set() or done == 0:
        body = completion(prompt="victim", max_tokens=40, ignore_eos=True, stream=True,
                          stream_options={"include_usage": True})
        async with client.stream("POST", C, json=body) as r:
            assert r.status_code == 200
            events = [json.loads(line[6:]) async for line in r.aiter_lines()
                      if line.startswith("data: ") and line != "data: [DONE]"]
        assert [e["choices"][0]["finish_reason"] for e in events if e["choices"] and
                e["choices"][0]["finish_reason"]] == ["length"]
        assert events[-1]["usage"]["completion_tokens"] == 40
        done += 1
    return done


def test_fuzzed_requests_never_5xx_and_never_disturb_others(server):
    rng = random.Random(20260501)
    requests = [fuzzed_request(rng) for _ in range(400)]
    statuses: dict[int, int] = {}

    async def send(client, limit, path, body):
        async with limit:
            content = json.dumps(body).encode()
            async with client.stream("POST", path, content=content) as r:
                statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
                assert r.status_code in (200, 400, 404), (path, body, r.status_code, await r.aread())
                if r.headers["content-type"].startswith("text/event-stream"):
                    await _check_stream(r)
                    return
                payload = json.loads(await r.aread())
                if r.status_code != 200:
                    assert payload["error"]["message"] and payload["error"]["param"] != "None", payload

    async def run():
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
            stop = asyncio.Event()
            victim = asyncio.create_task(_victim(client, stop))
            limit = asyncio.Semaphore(16)
            await asyncio.gather(*(send(client, limit, p, b) for p, b in requests))
            stop.set()
            return await victim
    assert asyncio.run(run()) >= 1
    # both paths were exercised (a body with "unknown_extra" or a garbage "priority" is always a 400)
    assert statuses.get(200, 0) > 15 and statuses.get(400, 0) > 100, statuses
    assert httpx.get(server.url + "/health").status_code == 200
    idle = settled_metrics(server, ("num_requests_pending", "num_requests_running", "kv_blocks_used"))
    assert idle == dict.fromkeys(idle, 0.0), idle
