"""``stress --overload``: N concurrent requests at once, and what became of each (issue 27)."""
from __future__ import annotations

import asyncio
import json
import re
import statistics
import time
from collections import Counter
from dataclasses import dataclass

import h11
import httpx

from gh200rt.bench.server import ServerStartFailed, served

DRAINED = ("admitted_sequences", "num_requests_pending", "num_requests_running", "num_requests_waiting",
           "kv_blocks_used")
WORDS = "the quick brown fox jumps over a lazy dog while seven wizards quietly hum old songs".split()


@dataclass
class Answer:
    outcome: str                  # "200" or "503"
    seconds: float
    retry_after: int | None = None
    message: str = ""


def request_of(i: int, max_tokens: int, prompt_words: int) -> tuple[str, dict]:
    """Every fourth request of each kind: chat / completion x streamed / plain."""
    text = f"request {i}: " + " ".join(WORDS[(i + k) % len(WORDS)] for k in range(prompt_words))
    body = {"max_tokens": max_tokens, "ignore_eos": True, "stream": i % 4 < 2}
    if body["stream"]:
        body["stream_options"] = {"include_usage": True}
    if i % 2:
        return "/v1/completions", {**body, "prompt": text}
    return "/v1/chat/completions", {**body, "messages": [{"role": "user", "content": text}]}


def classify(body: dict, status: int, headers, raw: bytes, seconds: float) -> Answer:
    """A complete answer or a clean 503; AssertionError (saying why) for anything else."""
    if status == 503:
        assert headers.get("content-type") == "application/json", f"a 503 that is not JSON: {headers}"
        retry_after = int(headers["retry-after"])
        assert retry_after >= 1, headers
        error = json.loads(raw)["error"]
        assert error["type"] == "service_unavailable", error
        return Answer("503", seconds, retry_after, error["message"])
    assert status == 200, f"HTTP {status}: {raw[:300]!r}"
    if not body["stream"]:
        answer = json.loads(raw)
        assert answer["choices"][0]["finish_reason"] == "length", answer
        assert answer["usage"]["completion_tokens"] == body["max_tokens"], answer["usage"]
        return Answer("200", seconds)
    lines = [line for line in raw.decode().splitlines() if line.startswith("data: ")]
    assert lines and lines[-1] == "data: [DONE]", f"a stream without [DONE]: {lines[-3:]}"
    chunks = [json.loads(line[6:]) for line in lines[:-1]]
    assert not any("error" in c for c in chunks), [c for c in chunks if "error" in c][:1]
    finishes = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert finishes == ["length"], finishes
    assert chunks[-1]["usage"]["completion_tokens"] == body["max_tokens"], chunks[-1]
    return Answer("200", seconds)


async def post(url: str, path: str, body: dict, timeout: float) -> tuple[int, dict[str, str], bytes]:
    """One POST on its own connection, read to the end: (status, headers, body). h11 over a bare socket,
    not httpx: at 500 connections httpx's pool spends ~13 ms of CPU per request on this machine (6.6 s a
    burst, on the cores the server needs), which would be measured as the server's latency."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.wait_for(asyncio.open_connection(host, int(port)), timeout)
    try:
        conn = h11.Connection(h11.CLIENT)
        data = json.dumps(body).encode()
        writer.write(conn.send(h11.Request(method="POST", target=path, headers=[
            ("host", host), ("content-type", "application/json"), ("content-length", str(len(data)))])))
        writer.write(conn.send(h11.Data(data=data)) + conn.send(h11.EndOfMessage()))
        status, headers, chunks = 0, {}, []
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(await asyncio.wait_for(reader.read(65536), timeout))
            elif isinstance(event, h11.Response):
                status = event.status_code
                headers = {k.decode(): v.decode() for k, v in event.headers}
            elif isinstance(event, h11.Data):
                chunks.append(bytes(event.data))
            elif isinstance(event, (h11.EndOfMessage, h11.ConnectionClosed)):
                return status, headers, b"".join(chunks)
    finally:
        writer.close()


async def burst(url: str, requests: int, max_tokens: int, prompt_words: int = 2,
                timeout: float = 600.0) -> list[Answer | str]:
    """Every request at once; each ends as an Answer, or as a string saying why it failed."""
    async def one(i):
        path, body = request_of(i, max_tokens, prompt_words)
        start = time.monotonic()
        try:
            status, headers, raw = await post(url, path, body, timeout)
            return classify(body, status, headers, raw, time.monotonic() - start)
        except (AssertionError, OSError, asyncio.TimeoutError, h11.ProtocolError, json.JSONDecodeError, KeyError,
                ValueError) as e:
            return f"{type(e).__name__}: {e}"[:300]

    return await asyncio.gather(*(one(i) for i in range(requests)))


def metrics(url: str) -> dict[str, float]:
    text = httpx.get(url + "/metrics", timeout=30).text
    return {m.group(1): float(m.group(2)) for m in re.finditer(r"^(?:gh200rt_)?(\w+) (\S+)$", text, re.M)}


def settled(url: str, timeout: float = 60.0, idle: float = 2.0) -> dict[str, float]:
    """/metrics ``idle`` seconds after nothing is held (the engine thread hands freed heap back to the
    kernel after half a second idle), or after ``timeout``."""
    deadline = time.monotonic() + timeout
    while any(metrics(url)[name] for name in DRAINED) and time.monotonic() < deadline:
        time.sleep(0.25)
    time.sleep(idle)
    return metrics(url)


def spread(values: list[float], unit: float = 1.0) -> str:
    if not values:
        return "-"
    values = sorted(values)
    p99 = values[min(len(values) - 1, int(len(values) * 0.99))]
    return f"p50 {statistics.median(values) * unit:.2f}  p99 {p99 * unit:.2f}  max {values[-1] * unit:.2f}"


def mib(values: dict[str, float]) -> float:
    return values.get("process_resident_memory_bytes", 0.0) / 2**20


def measure(url: str, args) -> bool:
    httpx.post(url + "/v1/completions", json={"prompt": "warm up", "max_tokens": 4}, timeout=600)
    before = settled(url)
    started = time.monotonic()
    answers = asyncio.run(burst(url, args.requests, args.max_tokens, args.prompt_words))
    seconds = time.monotonic() - started
    at_end = metrics(url)
    after = settled(url)
    health = httpx.get(url + "/health", timeout=30).status_code
    good = [a for a in answers if isinstance(a, Answer)]
    failures = [a for a in answers if isinstance(a, str)]
    refused = [a for a in good if a.outcome == "503"]
    counts = Counter(a.outcome for a in good)
    grew = lambda name: after[name] - before[name]  # noqa: E731
    print(f"{args.requests} requests at once, answered in {seconds:.1f} s: {counts['200']} x 200, "
          f"{counts['503']} x 503, {len(failures)} failed")
    print(f"  200 seconds: {spread([a.seconds for a in good if a.outcome == '200'])}")
    print(f"  503 ms:      {spread([a.seconds for a in refused], 1000)}")
    if refused:
        print(f"  Retry-After: {dict(sorted(Counter(a.retry_after for a in refused).items()))}")
        print(f"  e.g. {refused[-1].message!r}")
    print(f"  gh200rt_admission_rejections_total +{grew('admission_rejections_total'):.0f}, "
          f"requests_success_total +{grew('requests_success_total'):.0f}, "
          f"num_preemptions_total +{grew('num_preemptions_total'):.0f}")
    print(f"  RSS before {mib(before):.1f} MiB, at the end of the burst {mib(at_end):.1f}, idle after {mib(after):.1f} "
          f"({mib(after) / mib(before) - 1:+.1%})")
    print(f"  after: {', '.join(f'{n} {after[n]:.0f}' for n in DRAINED)}; asyncio tasks {after['server_tasks']:.0f} "
          f"(before {before['server_tasks']:.0f}); /health {health}")
    for failure in failures[:5]:
        print(f"  FAIL {failure}")
    return (not failures and not any(after[n] for n in DRAINED) and health == 200
            and after["server_tasks"] <= before["server_tasks"])


def run_overload(args) -> int:
    try:
        with served(args) as url:
            ok = measure(url, args)
    except ServerStartFailed as err:
        print(f"FAIL start: {err}")
        return 1
    print("overload: " + ("passed" if ok else "FAILED"))
    return 0 if ok else 1
