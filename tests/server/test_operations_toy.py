"""Load, faults and lifecycle against the real server process (toy model): disconnects free KV
blocks, a full queue answers 503, SIGTERM drains, API key and CORS."""
import asyncio
import time

import pytest

httpx = pytest.importorskip("httpx")  # the test extra: a bare GPU host need not have it

from tests.server.conftest import TOY_ARGS  # noqa: E402
from tests.server.helpers import (ServerProcess, check_drained, check_streams_with_disconnects, metric,  # noqa: E402
                                  settled_metrics, sigterm_during_streams)


def test_64_streams_third_disconnected_free_everything(toy_server):
    check_streams_with_disconnects(toy_server, timeout=60)
    assert metric(toy_server, "requests_aborted_total") >= 22


def test_non_streaming_disconnect_aborts(toy_server):
    before = metric(toy_server, "requests_aborted_total")
    try:
        httpx.post(toy_server.url + "/v1/completions", json={"prompt": "x", "max_tokens": 200, "ignore_eos": True},
                   timeout=0.3)
    except httpx.TimeoutException:
        pass
    deadline = time.monotonic() + 5
    while metric(toy_server, "requests_aborted_total") == before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert metric(toy_server, "requests_aborted_total") == before + 1
    assert settled_metrics(toy_server, ("kv_blocks_used", "num_requests_running")) == {
        "kv_blocks_used": 0, "num_requests_running": 0}


def test_full_queue_rejects_with_503(start_toy_server):
    server = start_toy_server("--max-num-seqs", "2", "--max-queued-requests", "1")

    async def run():
        async with httpx.AsyncClient(timeout=60) as client:
            return await asyncio.gather(*(client.post(server.url + "/v1/completions", json={
                "prompt": "q", "max_tokens": 30, "ignore_eos": True}) for _ in range(8)))
    statuses = sorted(r.status_code for r in asyncio.run(run()))
    assert statuses.count(200) >= 3 and 503 in statuses and set(statuses) <= {200, 503}
    assert httpx.post(server.url + "/v1/completions", json={"prompt": "q", "max_tokens": 2}).status_code == 200


def test_sigterm_drains_in_flight_refuses_new_and_exits(start_toy_server):
    server = start_toy_server("--shutdown-timeout", "60")
    bodies = [{"prompt": f"p{i}", "max_tokens": 200, "ignore_eos": True, "stream_options": {"include_usage": True}}
              for i in range(8)]
    check_drained(asyncio.run(sigterm_during_streams(server, bodies, exit_within=15)), 200)


def test_api_key_and_cors(start_toy_server):
    server = start_toy_server("--api-key", "sekrit", "--allowed-origins", "http://ok.example")
    body = {"prompt": "hi", "max_tokens": 2}
    assert httpx.get(server.url + "/health").status_code == 200
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        r = httpx.post(server.url + "/v1/completions", json=body, headers=headers)
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    assert httpx.get(server.url + "/v1/models").status_code == 401
    assert httpx.get(server.url + "/metrics").status_code == 401
    good = {"Authorization": "Bearer sekrit", "Origin": "http://ok.example"}
    r = httpx.post(server.url + "/v1/completions", json=body, headers=good)
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "http://ok.example"
    pre = httpx.options(server.url + "/v1/completions", headers={
        "Origin": "http://ok.example", "Access-Control-Request-Method": "POST"})
    assert pre.status_code == 204 and "POST" in pre.headers["access-control-allow-methods"]
    other = httpx.post(server.url + "/v1/completions", json=body, headers={**good, "Origin": "http://evil.example"})
    assert "access-control-allow-origin" not in other.headers
    refused = httpx.options(server.url + "/v1/completions", headers={
        "Origin": "http://evil.example", "Access-Control-Request-Method": "POST"})
    assert refused.status_code == 400 and "allowed-origins" in refused.json()["error"]["message"]
    assert "access-control-allow-origin" not in refused.headers


def test_health_and_generation_503_while_the_model_loads(tmp_path):
    gate = tmp_path / "load"
    server = ServerProcess("tests.server.toy_server", TOY_ARGS, env={"TOY_LOAD_GATE": str(gate)}, wait_for=503)
    try:
        health = httpx.get(server.url + "/health")
        assert health.status_code == 503 and "loading" in health.json()["error"]["message"]
        chat = {"messages": [{"role": "user", "content": "hi"}]}
        for path, body in (("/v1/completions", {"prompt": "hi"}), ("/v1/chat/completions", chat),
                           ("/tokenize", {"prompt": "hi"}), ("/detokenize", {"tokens": [1]})):
            r = httpx.post(server.url + path, json=body)
            assert r.status_code == 503 and "/health" in r.json()["error"]["message"], (path, r.text)
        assert httpx.get(server.url + "/v1/models").json()["data"][0]["max_model_len"] is None
        assert "gh200rt_kv_blocks_total 0" in httpx.get(server.url + "/metrics").text
        gate.touch()
        deadline = time.monotonic() + 60
        while httpx.get(server.url + "/health").status_code != 200 and time.monotonic() < deadline:
            time.sleep(0.05)
        r = httpx.post(server.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2
    finally:
        server.stop()
