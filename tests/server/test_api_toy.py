"""The real server process (real LLMEngine over the toy model) over HTTP: openai client parity,
every error case with its OpenAI error body, and the server still answering afterwards."""
import json

import pytest

httpx = pytest.importorskip("httpx")  # the test extra: a bare GPU host need not have it
openai = pytest.importorskip("openai")


def client(server, **kw):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=kw.pop("api_key", "none"), max_retries=0, **kw)


def test_completions_stream_equals_non_stream_and_usage_adds_up(toy_server):
    c = client(toy_server)
    full = c.completions.create(model="toy", prompt="hello world", max_tokens=12, temperature=0)
    assert full.choices[0].finish_reason == "length"
    assert full.usage.completion_tokens == 12
    assert full.usage.total_tokens == full.usage.prompt_tokens + 12 and full.usage.prompt_tokens == 11
    chunks = list(c.completions.create(model="toy", prompt="hello world", max_tokens=12, temperature=0,
                                       stream=True, stream_options={"include_usage": True}))
    assert "".join(ch.choices[0].text for ch in chunks if ch.choices) == full.choices[0].text
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason] == ["length"]
    assert chunks[-1].usage.total_tokens == full.usage.total_tokens and not chunks[-1].choices


def test_chat_stream_equals_non_stream_role_once(toy_server):
    c = client(toy_server)
    messages = [{"role": "system", "content": "be brief"},
                {"role": "user", "content": [{"type": "text", "text": "hi "}, {"type": "text", "text": "there"}]}]
    full = c.chat.completions.create(model="toy", messages=messages, max_tokens=8, temperature=0)
    assert full.choices[0].message.role == "assistant"
    chunks = list(c.chat.completions.create(model="toy", messages=messages, max_tokens=8, temperature=0,
                                            stream=True))
    assert all(ch.usage is None for ch in chunks)
    roles = [ch.choices[0].delta.role for ch in chunks if ch.choices[0].delta.role]
    assert roles == ["assistant"]
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks) == full.choices[0].message.content
    assert sum(1 for ch in chunks if ch.choices[0].finish_reason) == 1


def test_n_prompts_lists_token_ids_echo_logprobs_stop(toy_server):
    c = client(toy_server)
    out = c.completions.create(model="toy", prompt=[[5, 6, 7], [8, 9]], max_tokens=4, n=2, temperature=0,
                               logprobs=3, echo=True)
    assert sorted(ch.index for ch in out.choices) == [0, 1, 2, 3]
    assert out.choices[0].text.startswith("fgh") and out.choices[0].text == out.choices[1].text
    lp = out.choices[0].logprobs           # echo scores the prompt too: 3 prompt tokens, then 4 generated
    assert lp.tokens == list(out.choices[0].text) and lp.text_offset == list(range(7))
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert all(isinstance(x, float) for x in lp.token_logprobs[1:])
    assert all(len(top) >= 3 for top in lp.top_logprobs[1:])
    streamed = list(c.completions.create(model="toy", prompt=[[5, 6, 7], [8, 9]], max_tokens=4, n=2, temperature=0,
                                         logprobs=3, echo=True, stream=True))
    first = [ch.choices[0] for ch in streamed if ch.choices[0].index == 0]
    assert "".join(ch.text for ch in first) == out.choices[0].text
    assert sum((ch.logprobs.tokens for ch in first), []) == lp.tokens
    assert sum((ch.logprobs.text_offset for ch in first), []) == lp.text_offset
    assert sum((ch.logprobs.token_logprobs for ch in first), []) == lp.token_logprobs
    seeded = [c.completions.create(model="toy", prompt="abc", max_tokens=6, seed=7, temperature=1.0,
                                   extra_body={"top_k": 5, "min_p": 0.01, "repetition_penalty": 1.1,
                                               "ignore_eos": True, "min_tokens": 2}).choices[0].text
              for _ in range(2)]
    assert seeded[0] == seeded[1]
    text = out.choices[0].text[3:]
    stop = text[1:3]
    stopped = c.completions.create(model="toy", prompt=[5, 6, 7], max_tokens=4, temperature=0, stop=[stop])
    assert stopped.choices[0].finish_reason == "stop" and stopped.choices[0].text == text[:text.find(stop)]


ERRORS = [
    ("/v1/completions", b"not json", 400),
    ("/v1/completions", b"[1, 2]", 400),
    ("/v1/completions", {"max_tokens": 3}, 400),
    ("/v1/completions", {"prompt": ""}, 400),
    ("/v1/completions", {"prompt": []}, 400),
    ("/v1/completions", {"prompt": [1, -3]}, 400),
    ("/v1/completions", {"prompt": [1, 64]}, 400),
    ("/v1/completions", {"prompt": "hi", "logprobs": 21}, 400),
    ("/v1/completions", {"prompt": "hi", "seed": 2**64}, 400),
    ("/v1/completions", {"prompt": "hi", "temperature": -1}, 400),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 0}, 400),
    ("/v1/completions", {"prompt": "hi", "max_tokens": "5"}, 400),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 300}, 400),
    ("/v1/completions", {"prompt": "x" * 300, "max_tokens": 1}, 400),
    ("/v1/completions", {"prompt": "hi", "n": 0}, 400),
    ("/v1/completions", {"prompt": "hi", "top_p": 0}, 400),
    ("/v1/completions", {"prompt": "hi", "stop": [""]}, 400),
    ("/v1/completions", {"prompt": "hi", "model": "other"}, 404),
    ("/v1/chat/completions", {"messages": []}, 400),
    ("/v1/chat/completions", {"messages": [{"content": "x"}]}, 400),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": 5}]}, 400),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, 400),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}, 400),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "logprobs": True,
                              "top_logprobs": 21}, 400),
    ("/v1/nothing", {}, 404),
]


@pytest.mark.parametrize("path,body,status", ERRORS)
def test_error_cases_return_openai_error_body(toy_server, path, body, status):
    kw = {"content": body} if isinstance(body, bytes) else {"json": body}
    r = httpx.post(toy_server.url + path, timeout=10, **kw)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["message"] and set(err) == {"message", "type", "param", "code"}
    ok = httpx.post(toy_server.url + "/v1/completions", json={"prompt": "ok", "max_tokens": 2}, timeout=10)
    assert ok.status_code == 200


def test_oversized_body_413_and_stream_error_is_400_before_stream(start_toy_server):
    server = start_toy_server("--max-request-bytes", "2048")
    r = httpx.post(server.url + "/v1/completions", json={"prompt": "x" * 5000}, timeout=10)
    assert r.status_code == 413 and r.json()["error"]["code"] == 413
    r = httpx.post(server.url + "/v1/completions", json={"prompt": [1, 999], "stream": True}, timeout=10)
    assert r.status_code == 400 and "vocabulary" in r.json()["error"]["message"]


def test_models_tokenize_detokenize_version_metrics(toy_server):
    base = toy_server.url
    assert httpx.get(base + "/v1/models").json()["data"][0]["id"] == "toy"
    ids = httpx.post(base + "/tokenize", json={"prompt": "abc"}).json()["tokens"]
    assert ids == [38, 39, 40]
    assert httpx.post(base + "/detokenize", json={"tokens": ids}).json()["prompt"] == "mno"
    assert httpx.post(base + "/detokenize", json={"tokens": [64]}).status_code == 400
    assert httpx.get(base + "/version").status_code == 200
    text = httpx.get(base + "/metrics").text
    for name in ("requests_received_total", "time_to_first_token_seconds_bucket", "inter_token_latency_seconds",
                 "e2e_request_latency_seconds", "num_requests_running", "num_requests_waiting",
                 "kv_blocks_used", "prefix_cache_hit_rate", "generation_tokens_total"):
        assert f"gh200rt_{name}" in text


def test_usage_with_n_and_prompt_lists_counts_each_prompt_once(toy_server):
    c = client(toy_server)
    out = c.completions.create(model="toy", prompt=["abc", "de"], n=3, max_tokens=5, temperature=0.7, seed=1,
                               extra_body={"ignore_eos": True})
    assert len(out.choices) == 6
    assert out.usage.prompt_tokens == 5 and out.usage.completion_tokens == 30 and out.usage.total_tokens == 35
    chunks = list(c.completions.create(model="toy", prompt=["abc", "de"], n=3, max_tokens=5, temperature=0.7, seed=1,
                                       stream=True, stream_options={"include_usage": True},
                                       extra_body={"ignore_eos": True}))
    assert all(ch.usage is None for ch in chunks[:-1]) and chunks[-1].usage == out.usage
    finishes = [c.index for ch in chunks for c in ch.choices if c.finish_reason]
    assert sorted(finishes) == list(range(6))                  # exactly one finish_reason per choice
    chat = c.chat.completions.create(model="toy", messages=[{"role": "user", "content": "hi"}], n=2, max_tokens=4,
                                     extra_body={"ignore_eos": True})
    assert chat.usage.completion_tokens == 8 and chat.usage.prompt_tokens == len("<user>hi<assistant>")


def test_stream_chunks_carry_null_usage_only_when_usage_is_asked(toy_server):
    body = {"prompt": "abc", "max_tokens": 3, "stream": True}
    for options, want in ((None, False), ({"include_usage": True}, True), ({"include_usage": False}, False)):
        r = httpx.post(toy_server.url + "/v1/completions", json={**body, **({"stream_options": options}
                                                                              if options else {})}, timeout=30)
        lines = [line for line in r.text.splitlines() if line]
        assert all(line.startswith("data: ") for line in lines) and lines[-1] == "data: [DONE]"   # no keep-alives
        events = [json.loads(line[6:]) for line in lines[:-1]]
        assert all(("usage" in e) == want for e in events), (options, events)


def test_tiny_temperature_samples_greedily_like_vllm(toy_server):
    c = client(toy_server)
    greedy = c.completions.create(model="toy", prompt="abc", max_tokens=8, temperature=0)
    for t in (1e-6, 1e-300):        # 1e-300 is 0 in fp32: dividing logits by it must not happen
        tiny = c.completions.create(model="toy", prompt="abc", max_tokens=8, temperature=t)
        assert tiny.choices[0].text == greedy.choices[0].text, t


def test_async_scheduling_serves_what_the_synchronous_server_serves(toy_server, start_toy_server):
    """--async-scheduling through the server's engine loop: the same greedy completions, streams cut by their
    clients in flight leave nothing held, and steps were launched ahead."""
    from tests.server.helpers import check_streams_with_disconnects, metric
    server = start_toy_server("--async-scheduling")
    prompts = ["hello world", "abc", "a longer prompt than the others"]
    for prompt in prompts:
        sync, ahead = (client(s).completions.create(model="toy", prompt=prompt, max_tokens=12, temperature=0,
                                                    logprobs=2) for s in (toy_server, server))
        assert ahead.choices[0].text == sync.choices[0].text
        assert ahead.choices[0].logprobs.token_logprobs == sync.choices[0].logprobs.token_logprobs
    check_streams_with_disconnects(server, timeout=60, count=24)
    assert metric(server, "steps_launched_ahead_total") > 0
