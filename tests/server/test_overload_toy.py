"""Overload (issue 27): 500 concurrent requests, streamed and plain, chat and completions, against a
server that holds 20 sequences (4 running) and a KV cache smaller than those 4 need (so running
sequences are preempted). Every request gets a complete answer or a clean 503 with Retry-After, sent
before any stream starts; nothing else, nothing lost. Afterwards the server is healthy, holds nothing
(no admitted sequence, pending request, KV block or extra task) and its RSS is back near its idle size.

The burst and the checks of each answer are `python -m gh200rt.bench stress --overload`'s (which measures the same
against the
default server). The first burst is the warm-up: it brings the server's allocators to their high-water
mark for 500 connections; idle RSS is taken after it, and the second burst must come back within
RSS_TOLERANCE of it. A burst arrives before any sequence finished, so its refusals carry the unmeasured
Retry-After (1 s); a late wave, sent once the first sequences finished, gets one measured from the
drain rate."""
import asyncio
import time
from collections import Counter

import pytest

httpx = pytest.importorskip("httpx")  # the test extra: a bare GPU host need not have it
psutil = pytest.importorskip("psutil")

from gh200rt.bench.overload import Answer, burst  # noqa: E402
from tests.server.conftest import TOY_ARGS  # noqa: E402
from tests.server.helpers import ServerProcess, metric_in, settled_metrics  # noqa: E402

LIMITS = ["--max-num-seqs", "4", "--max-queued-requests", "16", "--max-model-len", "128", "--num-kv-blocks", "40"]
REQUESTS = 500
LATE = 20
MAX_TOKENS = 48           # ~60 tokens a sequence = 15 blocks of 4: four running sequences need 60 of the 40 blocks
RSS_TOLERANCE = 0.05      # of idle RSS (allocators keep pages): 30 KB leaked per request exceeds it
IDLE = ("admitted_sequences", "num_requests_pending", "num_requests_running", "num_requests_waiting",
        "kv_blocks_used")


def checked(answers: list) -> list[Answer]:
    failures = [a for a in answers if not isinstance(a, Answer)]
    assert not failures, failures[:5]
    for a in answers:
        assert a.outcome == "200" or (1 <= a.retry_after <= 60 and "limit is 20 (--max-num-seqs 4 + "
                                      "--max-queued-requests 16)" in a.message), a
    return answers


async def burst_then_late_wave(url: str, successes_before: float) -> tuple[list, list]:
    """The burst; then, once its first four sequences finished (so the drain rate is measured) and while
    the sixteen behind them still wait, LATE more requests."""
    first = asyncio.create_task(burst(url, REQUESTS, MAX_TOKENS))
    async with httpx.AsyncClient(base_url=url, timeout=10) as client:
        while metric_in((await client.get("/metrics")).text, "requests_success_total") < successes_before + 4:
            await asyncio.sleep(0.05)
    late = await burst(url, LATE, MAX_TOKENS)
    return await first, late


def seconds(answers: list[Answer], outcome: str) -> str:
    values = sorted(a.seconds for a in answers if a.outcome == outcome)
    return f"p50 {values[len(values) // 2]:.3f} s, max {values[-1]:.3f} s" if values else "-"


def scrape(server) -> str:
    return httpx.get(server.url + "/metrics", timeout=10).text


def test_500_concurrent_requests_each_get_an_answer_or_a_clean_503():
    server = ServerProcess("tests.server.toy_server", [*TOY_ARGS, *LIMITS])
    try:
        process = psutil.Process(server.proc.pid)
        start_rss = process.memory_info().rss
        warm = Counter(a.outcome for a in checked(asyncio.run(burst(server.url, REQUESTS, MAX_TOKENS))))
        assert settled_metrics(server, IDLE) == dict.fromkeys(IDLE, 0.0)
        time.sleep(0.5)
        idle_rss, before = process.memory_info().rss, scrape(server)
        idle_tasks = metric_in(before, "server_tasks")

        started = time.monotonic()
        answers, late = asyncio.run(burst_then_late_wave(server.url, metric_in(before, "requests_success_total")))
        took = time.monotonic() - started
        counts, late_counts = Counter(a.outcome for a in checked(answers)), Counter(a.outcome for a in checked(late))

        assert counts["200"] >= 4 and counts["503"] >= 100, counts
        assert all(a.retry_after == 1 for a in answers if a.outcome == "503")      # nothing had finished yet
        assert late_counts["503"] >= 1, late_counts
        assert all(a.retry_after >= 2 for a in late if a.outcome == "503"), [a.retry_after for a in late]
        assert httpx.get(server.url + "/health").status_code == 200
        assert settled_metrics(server, IDLE) == dict.fromkeys(IDLE, 0.0)
        time.sleep(0.5)
        after_rss, after = process.memory_info().rss, scrape(server)
        delta = {name: metric_in(after, name) - metric_in(before, name) for name in (
            "admission_rejections_total", "requests_success_total", "num_preemptions_total")}
        late_retry = Counter(a.retry_after for a in late if a.retry_after)
        print(f"\nwarm-up burst {dict(warm)}; burst {dict(counts)} in {took:.1f} s; 200 {seconds(answers, '200')}; "
              f"503 {seconds(answers, '503')}; late wave {dict(late_counts)}, Retry-After {dict(late_retry)}; "
              f"{delta}; RSS start {start_rss / 2**20:.1f} MiB, idle after warm-up {idle_rss / 2**20:.1f}, after "
              f"{after_rss / 2**20:.1f} MiB ({(after_rss - idle_rss) / idle_rss:+.1%}, bound {RSS_TOLERANCE:.0%}); "
              f"tasks idle {idle_tasks:.0f}, after {metric_in(after, 'server_tasks'):.0f}")
        assert delta["admission_rejections_total"] == counts["503"] + late_counts["503"], delta
        assert delta["requests_success_total"] == counts["200"] + late_counts["200"], delta
        assert delta["num_preemptions_total"] > 0, "the burst never filled the KV cache"
        assert metric_in(after, "server_tasks") == idle_tasks
        assert after_rss <= idle_rss * (1 + RSS_TOLERANCE), (idle_rss, after_rss)
    finally:
        server.stop()
