"""The four bugs of issue 13, each against the real server process over the toy model: one choice
per streamed chunk, disconnects abort requests wherever they are without tracebacks, CORS allows the
headers a browser asks for, non-JSON bodies and seeds beyond signed 64 bits are refused."""
import asyncio
import json
import time

import pytest

httpx = pytest.importorskip("httpx")  # the test extra: a bare GPU host need not have it

from tests.server.conftest import TOY_ARGS  # noqa: E402
from tests.server.helpers import ServerProcess, metric, settled_metrics  # noqa: E402


def sse_events(text: str) -> list[dict]:
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]


@pytest.mark.parametrize("path,body", [
    ("/v1/completions", {"prompt": ["ab", "cd"], "n": 3, "max_tokens": 4, "temperature": 1, "seed": 3}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "n": 3, "max_tokens": 4,
                              "temperature": 1, "seed": 3}),
])
def test_streaming_with_n_sends_one_choice_per_chunk(toy_server, path, body):
    r = httpx.post(toy_server.url + path, json={**body, "stream": True, "ignore_eos": True}, timeout=30)
    events = sse_events(r.text)
    assert events and all(len(e["choices"]) == 1 for e in events), [len(e["choices"]) for e in events]
    choices = len(body.get("prompt", [0])) * body["n"]
    finished = sorted(e["choices"][0]["index"] for e in events if e["choices"][0]["finish_reason"])
    assert finished == list(range(choices))
    if "messages" in body:
        roles = sorted(e["choices"][0]["index"] for e in events if e["choices"][0]["delta"].get("role"))
        assert roles == list(range(choices))


def test_abandoned_non_streaming_requests_leave_no_traceback(toy_server):
    async def abandon(client, i):
        try:
            await client.post("/v1/completions", json={"prompt": f"x{i}", "max_tokens": 150, "ignore_eos": True},
                              timeout=0.3)
        except httpx.TimeoutException:
            return
    async def run():
        async with httpx.AsyncClient(base_url=toy_server.url) as client:
            await asyncio.gather(*(abandon(client, i) for i in range(6)))
    asyncio.run(run())
    assert settled_metrics(toy_server, ("num_requests_pending", "kv_blocks_used")) == {
        "num_requests_pending": 0, "kv_blocks_used": 0}
    time.sleep(0.3)
    log = toy_server.read_log()
    assert "Traceback" not in log and "InvalidStateError" not in log and "internal error" not in log, log[-3000:]


def test_clients_that_leave_while_their_request_is_tokenized_cost_nothing():
    """Tokenization is serialised and slow here (0.1 s per chat request, as on a busy CPU): 30 clients
    leave at 0.5 s, while most of their requests still wait to be tokenized. Those must be dropped,
    so the next request is answered at once and no abandoned request generates a token."""
    server = ServerProcess("tests.server.toy_server", [*TOY_ARGS, "--max-num-seqs", "4"],
                           env={"TOY_TOKENIZE_SECONDS": "0.1"})
    try:
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 100, "ignore_eos": True}

        async def abandon(client):
            try:
                await client.post("/v1/chat/completions", json=body, timeout=0.5)
            except httpx.TimeoutException:
                pass

        async def run():
            async with httpx.AsyncClient(base_url=server.url, limits=httpx.Limits(max_connections=64)) as client:
                await asyncio.gather(*(abandon(client) for _ in range(30)))
        asyncio.run(run())
        start = time.monotonic()
        r = httpx.post(server.url + "/v1/chat/completions", json={**body, "max_tokens": 5}, timeout=30)
        elapsed = time.monotonic() - start
        assert r.status_code == 200
        assert elapsed < 1.5, f"the next request took {elapsed:.2f}s behind abandoned ones"
        assert metric(server, "requests_received_total") <= 12
        assert "Traceback" not in server.read_log()
    finally:
        server.stop()


def test_cors_preflight_allows_the_requested_headers(start_toy_server):
    server = start_toy_server("--allowed-origins", "http://ok.example")
    asked = "authorization, content-type, x-stainless-os, x-stainless-retry-count"
    r = httpx.options(server.url + "/v1/chat/completions", headers={
        "Origin": "http://ok.example", "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": asked})
    assert r.status_code == 204
    allowed = {h.strip() for h in r.headers["access-control-allow-headers"].split(",")}
    assert {"x-stainless-os", "x-stainless-retry-count", "authorization", "content-type"} <= allowed
    other = httpx.options(server.url + "/v1/models", headers={"Origin": "http://evil.example",
                                                              "Access-Control-Request-Headers": asked})
    assert "access-control-allow-headers" not in other.headers


@pytest.mark.parametrize("content_type,status", [
    ("application/x-www-form-urlencoded", 415), ("text/plain", 415), ("multipart/form-data; boundary=x", 415),
    ("application/json; charset=utf-8", 200), ("application/json", 200)])
def test_non_json_content_type_is_refused(toy_server, content_type, status):
    r = httpx.post(toy_server.url + "/v1/completions", content=json.dumps({"prompt": "hi", "max_tokens": 2}),
                   headers={"content-type": content_type}, timeout=10)
    assert r.status_code == status, r.text
    if status != 200:
        assert "application/json" in r.json()["error"]["message"]


@pytest.mark.parametrize("seed,status", [(2**63, 400), (2**64 - 1, 400), (-(2**63) - 1, 400), (2**63 - 1, 200),
                                         (-(2**63), 200)])
def test_seed_must_fit_signed_64_bits(toy_server, seed, status):
    r = httpx.post(toy_server.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2, "seed": seed},
                   timeout=10)
    assert r.status_code == status, r.text
    if status == 400:
        assert r.json()["error"]["param"] == "seed"
