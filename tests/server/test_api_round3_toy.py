"""vLLM's response keys and server flags the peer suites read (issue 48): chat bodies carry ``prompt_token_ids`` and
``prompt_logprobs``, chat choices ``token_ids``, null unless asked for; ``--enable-force-include-usage`` ends every
stream with a usage chunk; ``--enable-server-load-tracking`` answers ``GET /load`` with the requests in flight."""
import json
import threading

import pytest

httpx = pytest.importorskip("httpx")  # the test extra: a bare GPU host need not have it

CHAT = {"model": "toy", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}


def test_chat_bodies_carry_vllms_keys_null_unless_asked_for(toy_server):
    body = httpx.post(toy_server.url + "/v1/chat/completions", json=CHAT, timeout=30).json()
    assert body["prompt_token_ids"] is None and body["prompt_logprobs"] is None
    assert body["choices"][0]["token_ids"] is None
    asked = httpx.post(toy_server.url + "/v1/chat/completions", timeout=30,
                       json={**CHAT, "return_token_ids": True, "prompt_logprobs": 1}).json()
    assert asked["prompt_token_ids"] and len(asked["choices"][0]["token_ids"]) == 3
    assert len(asked["prompt_logprobs"]) == len(asked["prompt_token_ids"])


def _chunks(server, body):
    with httpx.stream("POST", server.url + body.pop("route"), json=body, timeout=30) as reply:
        return [json.loads(line[6:]) for line in reply.iter_lines() if line.startswith("data: {")]


def test_forced_usage_and_the_load_route(start_toy_server, toy_server):
    plain = _chunks(toy_server, {"route": "/v1/chat/completions", **CHAT, "stream": True})
    assert all("usage" not in chunk or chunk["usage"] is None for chunk in plain)
    assert httpx.get(toy_server.url + "/load").status_code == 404
    server = start_toy_server("--enable-force-include-usage", "--enable-server-load-tracking",
                              "--enable-prompt-tokens-details")
    for route, body in (("/v1/chat/completions", CHAT), ("/v1/completions", {"model": "toy", "prompt": "hi",
                                                                             "max_tokens": 3})):
        chunks = _chunks(server, {"route": route, **body, "stream": True})
        assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 3
    assert httpx.get(server.url + "/load").json() == {"server_load": 0}
    seen = []

    def long_request():
        httpx.post(server.url + "/v1/completions", json={"model": "toy", "prompt": "hi", "max_tokens": 150,
                                                         "ignore_eos": True}, timeout=60)
    thread = threading.Thread(target=long_request)
    thread.start()
    for _ in range(500):
        seen.append(httpx.get(server.url + "/load").json()["server_load"])
        if seen[-1]:
            break
    thread.join(60)
    assert 1 in seen and httpx.get(server.url + "/load").json() == {"server_load": 0}
