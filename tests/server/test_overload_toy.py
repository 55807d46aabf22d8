"""Overload (issue 27): 500 concurrent requests, streamed and plain, chat and completions, against a
server that holds 20 sequences (4 running) and a KV cache smaller than those 4 need (so running
sequences are preempted). Every request gets a complete answer or a clean 503 with Retry-After, sent
before any stream starts; nothing else, nothing lost. Afterwards the server is healthy, holds nothing
(no admitted sequence, pending request, KV block or extra task) and its RSS is back near its idle size.

The first burst is the warm-up: it brings the server's allocators to their high-water mark for 500
connections (+13 MiB on this machine); idle RSS is taken after it, and the second burst must come
back within RSS_TOLERANCE of it."""
import asyncio
import json
import time
from collections import Counter

import pytest

httpx = pytest.importorskip("httpx")  # the test extra: a bare GPU host need not have it
psutil = pytest.importorskip("psutil")

from tests.server.conftest import TOY_ARGS  # noqa: E402
from tests.server.helpers import ServerProcess, metric_in, settled_metrics  # noqa: E402

LIMITS = ["--max-num-seqs", "4", "--max-queued-requests", "16", "--max-model-len", "128", "--num-kv-blocks", "40"]
BURST = 500
MAX_TOKENS = 48           # ~60 tokens a sequence = 15 blocks of 4: four running sequences need 60 of the 40 blocks
RSS_TOLERANCE = 0.05      # of idle RSS: allocators keep pages; a leak of 500 requests' state would exceed it
IDLE = ("admitted_sequences", "num_requests_pending", "num_requests_running", "num_requests_waiting",
        "kv_blocks_used")


def request_of(i: int) -> tuple[str, dict]:
    """Every fourth request of each kind: chat / completion x streamed / plain."""
    body = {"max_tokens": MAX_TOKENS, "ignore_eos": True, "stream": i % 4 < 2}
    if body["stream"]:
        body["stream_options"] = {"include_usage": True}
    if i % 2:
        return "/v1/completions", {**body, "prompt": f"prompt {i}"}
    return "/v1/chat/completions", {**body, "messages": [{"role": "user", "content": f"question {i}"}]}


def check_answer(stream: bool, status: int, headers, raw: bytes) -> str:
    """'200' for a complete answer, '503' for a clean refusal; anything else fails the test."""
    if status == 503:
        assert headers["content-type"] == "application/json", headers          # refused before any stream
        assert 1 <= int(headers["retry-after"]) <= 60, headers
        error = json.loads(raw)["error"]
        assert error["type"] == "service_unavailable" and error["code"] == "server_overloaded", error
        assert "limit is 20 (--max-num-seqs 4 + --max-queued-requests 16)" in error["message"], error
        return "503"
    assert status == 200, (status, raw[:500])
    if not stream:
        body = json.loads(raw)
        assert body["choices"][0]["finish_reason"] == "length", body
        assert body["usage"]["completion_tokens"] == MAX_TOKENS, body
        return "200"
    lines = [line for line in raw.decode().splitlines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]", lines[-3:]
    chunks = [json.loads(line[6:]) for line in lines[:-1]]
    finishes = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert finishes == ["length"] and chunks[-1]["usage"]["completion_tokens"] == MAX_TOKENS, chunks[-1]
    return "200"


async def burst(url: str) -> tuple[Counter, list[float]]:
    async def one(client, i):
        path, body = request_of(i)
        start = time.monotonic()
        async with client.stream("POST", path, json=body) as r:
            raw = await r.aread()
        return check_answer(body["stream"], r.status_code, r.headers, raw), time.monotonic() - start

    async with httpx.AsyncClient(base_url=url, timeout=120, limits=httpx.Limits(max_connections=BURST)) as client:
        results = await asyncio.gather(*(one(client, i) for i in range(BURST)))
    return Counter(kind for kind, _ in results), sorted(seconds for kind, seconds in results if kind == "200")


def scrape(server) -> str:
    return httpx.get(server.url + "/metrics", timeout=10).text


def test_500_concurrent_requests_each_get_an_answer_or_a_clean_503():
    server = ServerProcess("tests.server.toy_server", [*TOY_ARGS, *LIMITS])
    try:
        process = psutil.Process(server.proc.pid)
        start_rss = process.memory_info().rss
        warm, _ = asyncio.run(burst(server.url))
        assert settled_metrics(server, IDLE) == dict.fromkeys(IDLE, 0.0)
        time.sleep(0.5)
        idle_rss, before = process.memory_info().rss, scrape(server)
        idle_tasks = metric_in(before, "server_tasks")

        started = time.monotonic()
        answered, latencies = asyncio.run(burst(server.url))
        seconds = time.monotonic() - started

        assert answered["200"] >= 4 and answered["503"] >= 100, answered
        assert httpx.get(server.url + "/health").status_code == 200
        assert settled_metrics(server, IDLE) == dict.fromkeys(IDLE, 0.0)
        time.sleep(0.5)
        after_rss, after = process.memory_info().rss, scrape(server)
        delta = {name: metric_in(after, name) - metric_in(before, name) for name in (
            "admission_rejections_total", "requests_success_total", "num_preemptions_total")}
        print(f"\nwarm-up burst {dict(warm)}; burst {dict(answered)} in {seconds:.1f} s, 200 latency "
              f"p50 {latencies[len(latencies) // 2]:.2f} s max {latencies[-1]:.2f} s; {delta}; RSS start "
              f"{start_rss / 2**20:.1f} MiB, idle after warm-up {idle_rss / 2**20:.1f}, after {after_rss / 2**20:.1f} "
              f"MiB ({(after_rss - idle_rss) / idle_rss:+.1%}, bound {RSS_TOLERANCE:.0%}); tasks idle {idle_tasks:.0f}, "
              f"after {metric_in(after, 'server_tasks'):.0f}")
        assert delta["admission_rejections_total"] == answered["503"], delta
        assert delta["requests_success_total"] == answered["200"], delta
        assert delta["num_preemptions_total"] > 0, "the burst never filled the KV cache"
        assert metric_in(after, "server_tasks") == idle_tasks
        assert after_rss <= idle_rss * (1 + RSS_TOLERANCE), (idle_rss, after_rss)
    finally:
        server.stop()
