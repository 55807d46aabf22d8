"""Start the real server as a subprocess on a free loopback port and stop it; read its metrics; drive a
SIGTERM during load."""
import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass

import pytest

httpx = pytest.importorskip("httpx")  # the test extra: a bare GPU host need not have it
psutil = pytest.importorskip("psutil")

from tests.zygote import FRESH_INTERPRETERS, zygote  # noqa: E402 - after the skips above

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    def __init__(self, module: str, args: list[str], ready_timeout: float = 120.0, env: dict | None = None,
                 wait_for: int = 200):
        """Start the server and wait until /health answers ``wait_for`` (200: loaded; 503: listening)."""
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = f"/tmp/gh200rt-test-server-{self.port}.log"
        self.log = open(self.log_path, "w")
        argv = ["--port", str(self.port), "--log-level", "warning", *args]
        env = {**os.environ, "PYTHONPATH": ROOT, **(env or {})}
        self.proc = None if FRESH_INTERPRETERS else zygote(ROOT).start(module, argv, ROOT, env, self.log_path)
        if self.proc is None:
            self.proc = subprocess.Popen([sys.executable, "-m", module, *argv], cwd=ROOT, stdout=self.log,
                                         stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + ready_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}: {self.read_log()}")
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == wait_for:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"server did not answer /health {wait_for} within {ready_timeout}s: {self.read_log()}")

    def read_log(self) -> str:
        self.log.flush()
        with open(self.log_path) as f:
            return f.read()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.log.close()


def metric(server, name: str) -> float:
    return metric_in(httpx.get(server.url + "/metrics", timeout=10).text, name)


def settled_metrics(server, names: tuple[str, ...], timeout: float = 10.0) -> dict[str, float]:
    """The named metrics once all are zero, or their last values after ``timeout`` (engine gauges are
    published by the engine thread a moment after the last request's response)."""
    deadline = time.monotonic() + timeout
    while True:
        text = httpx.get(server.url + "/metrics", timeout=10).text
        values = {name: metric_in(text, name) for name in names}
        if not any(values.values()) or time.monotonic() > deadline:
            return values
        time.sleep(0.05)


def metric_in(text: str, name: str) -> float:
    return float(re.search(rf"^gh200rt_{name} (\S+)$", text, re.M).group(1))


async def _next_event(lines) -> dict | None:
    """The next SSE data payload of a stream; None at [DONE]."""
    async for line in lines:
        if line.startswith("data: "):
            return None if line == "data: [DONE]" else json.loads(line[6:])
    raise AssertionError("the stream ended without data: [DONE]")


@dataclass
class DrainResult:
    streams: list[list[dict]]        # every chunk of each in-flight stream, [DONE] seen
    pending_after_late: float        # the server's pending requests right after the late request was refused
    late: httpx.Response
    exit_code: int
    children_left: list


async def sigterm_during_streams(server: ServerProcess, bodies: list[dict], exit_within: float) -> DrainResult:
    """Open one streaming completion per body and read each one's first chunk (so all are provably
    generating), send SIGTERM, wait until /health reports the shutdown, send a late request, read
    the server's pending count, then let every stream finish and the process exit."""
    children = psutil.Process(server.proc.pid).children(recursive=True)
    async with httpx.AsyncClient(base_url=server.url, timeout=300,
                                 limits=httpx.Limits(max_connections=len(bodies) + 4)) as client:
        async def open_stream(body):
            r = await client.send(client.build_request("POST", "/v1/completions", json={**body, "stream": True}),
                                  stream=True)
            assert r.status_code == 200, await r.aread()
            lines = r.aiter_lines()
            return r, lines, [await _next_event(lines)]

        opened = await asyncio.gather(*(open_stream(b) for b in bodies))
        server.proc.send_signal(signal.SIGTERM)
        while (await client.get("/health")).status_code == 200:
            await asyncio.sleep(0.005)
        late = await client.post("/v1/completions", json={"prompt": "late", "max_tokens": 2})
        pending = metric_in((await client.get("/metrics")).text, "num_requests_pending")

        async def finish(response, lines, chunks):
            while (event := await _next_event(lines)) is not None:
                chunks.append(event)
            await response.aclose()
            return chunks
        streams = await asyncio.gather(*(finish(*o) for o in opened))
    exit_code = await asyncio.to_thread(server.proc.wait, exit_within)
    return DrainResult(streams, pending, late, exit_code, [c for c in children if c.is_running()])


def check_drained(result: DrainResult, max_tokens: int) -> None:
    """The acceptance: in-flight streams complete, the late request is refused, clean exit, no children."""
    n = len(result.streams)
    assert result.pending_after_late == n, f"only {result.pending_after_late} of {n} streams were still running"
    assert result.late.status_code == 503, result.late.text
    assert "shutting down" in result.late.json()["error"]["message"]
    for chunks in result.streams:
        finishes = [c["choices"][0]["finish_reason"] for c in chunks
                    if c["choices"] and c["choices"][0]["finish_reason"]]
        assert finishes == ["length"], finishes
        assert chunks[-1]["usage"]["completion_tokens"] == max_tokens, chunks[-1]
    assert result.exit_code == 0
    assert result.children_left == []


async def _stream(client, url, i, disconnect_after):
    body = {"prompt": f"prompt {i}", "max_tokens": 40, "stream": True, "ignore_eos": True}
    chunks, finish = 0, []
    async with client.stream("POST", url + "/v1/completions", json=body) as r:
        assert r.status_code == 200, await r.aread()
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            choice = json.loads(line[6:])["choices"][0]
            chunks += 1
            if choice["finish_reason"]:
                finish.append(choice["finish_reason"])
            if disconnect_after and chunks >= disconnect_after:
                return "disconnected"
    assert finish == ["length"], finish
    return "completed"


def check_streams_with_disconnects(server, timeout: float, count: int = 64) -> None:
    """``count`` concurrent streams, every third cut by the client after 3 chunks: the rest complete, and
    afterwards nothing is pending or running and no KV block is held by a request."""
    async def run():
        async with httpx.AsyncClient(timeout=timeout, limits=httpx.Limits(max_connections=100)) as client:
            return await asyncio.gather(*(_stream(client, server.url, i, 3 if i % 3 == 0 else 0)
                                          for i in range(count)))
    results = asyncio.run(run())
    cut = len(range(0, count, 3))
    assert results.count("completed") == count - cut and results.count("disconnected") == cut, results
    idle = settled_metrics(server, ("num_requests_pending", "num_requests_running", "kv_blocks_used"))
    assert idle == dict.fromkeys(idle, 0.0), idle
